"""The scheduler's side of speculative decoding, against a scripted model: outputs equal
the script's whatever the drafts; rejected drafts are stepped back over; drafts stay within
max_tokens; and while a step in flight verifies drafts nothing runs ahead."""

from __future__ import annotations

from loom.config import CacheConfig, SchedulerConfig
from loom.core.request import Request
from loom.core.sched_output import ModelRunnerOutput, SchedulerOutput
from loom.core.scheduler import Scheduler
from loom.sampling_params import SamplingParams
from loom.speculative_config import SpeculativeConfig


def script(rid: str, position: int) -> int:
    """The model's token at each position: a loop of 3 for "loop", never repeating else."""
    return 10 + position % 3 if rid == "loop" else 1000 + position


def make(async_scheduling: bool = True) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64,
                                     async_scheduling=async_scheduling),
                     CacheConfig(block_size=4), 64, 256,
                     SpeculativeConfig(method="ngram", num_speculative_tokens=3,
                                       prompt_lookup_min=1, prompt_lookup_max=2))


def add(sched: Scheduler, rid: str, n: int, max_tokens: int = 20) -> Request:
    request = Request(rid, [script(rid, i) for i in range(n)],
                      SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    sched.add_request(request)
    return request


def execute(out: SchedulerOutput, computed: dict[str, int]) -> ModelRunnerOutput:
    """Verify each request's drafts against the script; every step's last row samples."""
    drafts = {c.req_id: c.spec_token_ids for c in out.cached_reqs}
    sampled = []
    for rid, n in out.num_scheduled_tokens.items():
        start = next((c.num_computed_tokens for c in out.cached_reqs if c.req_id == rid), 0)
        first = start + n - len(drafts.get(rid, []))  # the position sampled after the input
        tokens = []
        for j, draft in enumerate(drafts.get(rid, [])):
            if draft != script(rid, first + j):
                break
            tokens.append(draft)
        sampled.append(tokens + [script(rid, first + len(tokens))])
        computed[rid] = start + n
    return ModelRunnerOutput(req_ids=list(out.num_scheduled_tokens), sampled_token_ids=sampled)


def test_outputs_follow_the_script_with_drafts_kept_and_stepped_back_over():
    sched = make(async_scheduling=False)
    loop, other = add(sched, "loop", 7, max_tokens=20), add(sched, "other", 5, max_tokens=9)
    computed: dict[str, int] = {}
    drafted = 0
    while sched.has_unfinished_requests():
        out = sched.schedule()
        drafted += sum(len(c.spec_token_ids) for c in out.cached_reqs)
        for c in out.cached_reqs:  # drafts never let an output pass max_tokens
            request = sched.requests[c.req_id]
            assert request.num_output_tokens + len(c.spec_token_ids) + 1 <= request.max_tokens
        sched.update_from_output(out, execute(out, computed))
        for request in (loop, other):
            if not request.is_finished:
                assert request.num_computed_tokens == request.num_tokens - 1
    assert loop.output_token_ids == [script("loop", p) for p in range(7, 27)]
    assert other.output_token_ids == [script("other", p) for p in range(5, 14)]
    assert drafted > 0 and sched.spec.totals()[2] > 0  # drafts proposed and kept


def test_nothing_runs_ahead_while_a_step_verifies_drafts():
    sched = make()
    add(sched, "loop", 7)
    add(sched, "other", 5)
    computed: dict[str, int] = {}
    first = sched.schedule()  # both prompts
    ahead = sched.schedule()  # both decode ahead of the prompts' tokens
    assert set(ahead.num_scheduled_tokens) == {"loop", "other"}
    sched.update_from_output(first, execute(first, computed))
    assert [len(c.spec_token_ids) for c in ahead.cached_reqs if c.req_id == "loop"] == [2]
    # "loop" drafted behind its token in flight: nothing may run ahead of that step now.
    assert sched.schedule().num_scheduled_tokens == {}
    sched.update_from_output(ahead, execute(ahead, computed))
    assert set(sched.schedule().num_scheduled_tokens) == {"loop", "other"}


def test_a_draft_models_proposals_follow_its_last_step_with_room_for_their_kv():
    """A draft model proposes on the worker (`ModelRunnerOutput.draft_token_ids`): the next
    decode verifies them, within max_tokens, and allocates k slots past its tokens for the
    drafter's next drafts; its requests never run ahead, and proposals made for other
    tokens are not taken."""
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64),
                      CacheConfig(block_size=4), 64, 256,
                      SpeculativeConfig(method="draft_model", model="d", num_speculative_tokens=3))
    request = add(sched, "other", 4, max_tokens=9)
    computed: dict[str, int] = {}
    out = sched.schedule()
    assert sched.kv_cache_manager.num_blocks_of("other") == 2  # 4 tokens, 3 slots past
    late = add(sched, "late", 3)
    # Nothing runs ahead, nor starts beside a step in flight: it joins the next one.
    assert sched.schedule().num_scheduled_tokens == {}
    result = execute(out, computed)
    result.draft_token_ids = {"other": [script("other", 5), script("other", 6), 0]}
    sched.update_from_output(out, result)
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"other": 4, "late": 3}
    assert out.cached_reqs[0].spec_token_ids == result.draft_token_ids["other"]
    sched.abort_requests(["late"])
    # 5 tokens + 3 drafts computed, then 3 slots for the drafter: 11 tokens, 3 blocks.
    assert sched.kv_cache_manager.num_blocks_of("other") == 3
    sched.update_from_output(out, execute(out, computed))  # the third draft is rejected
    assert request.output_token_ids == [script("other", p) for p in range(4, 8)]
    stale = sched.schedule()  # the proposals were for tokens now known: none taken
    assert stale.cached_reqs[0].spec_token_ids == []
    result = execute(stale, computed)
    result.draft_token_ids = {"other": [script("other", p) for p in range(9, 12)]}
    sched.update_from_output(stale, result)
    out = sched.schedule()  # 5 of 9 tokens out: 3 drafts and the token after fit
    assert out.cached_reqs[0].spec_token_ids == result.draft_token_ids["other"]
    sched.update_from_output(out, execute(out, computed))
    assert request.output_token_ids == [script("other", p) for p in range(4, 13)]
    assert request.is_finished
