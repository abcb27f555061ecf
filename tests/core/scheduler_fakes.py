"""The scheduler tests' fakes: a scheduler of small blocks, requests, and a worker that keeps
per-request state from the scheduler's diffs (as a real one must) and samples scripted
tokens."""

from __future__ import annotations

from collections.abc import Callable

from loom.config import CacheConfig, SchedulerConfig
from loom.core.request import Request
from loom.core.sched_output import ModelRunnerOutput, SchedulerOutput
from loom.core.scheduler import Scheduler
from loom.engine.protocol import EngineCoreOutput
from loom.sampling_params import SamplingParams

BS = 4


def make_scheduler(num_blocks: int = 64, max_num_seqs: int = 16, budget: int = 256,
                   max_model_len: int = 256, caching: bool = True,
                   headroom: int | None = None) -> Scheduler:
    """headroom: kv_headroom_tokens (None: the default); 0 admits as vLLM does, which the
    preemption tests need to get a request preempted at all. max_num_seqs is capped at the
    budget, which may not be smaller (as in vLLM)."""
    extra = {} if headroom is None else {"kv_headroom_tokens": headroom}
    return Scheduler(SchedulerConfig(max_num_seqs=min(max_num_seqs, budget),
                                     max_num_batched_tokens=budget,
                                     **extra),
                     CacheConfig(block_size=BS, enable_prefix_caching=caching),
                     num_blocks, max_model_len)


def add(sched: Scheduler, rid: str, prompt: list[int], eos: int | None = None,
        **params) -> Request:
    request = Request(rid, prompt, SamplingParams(**params), eos_token_id=eos)
    sched.add_request(request)
    return request


def by_position(rid: str, num_tokens: int) -> int:
    return 100 + num_tokens


class FakeWorker:
    """Keeps per-request state from the scheduler's diffs, as a real worker must, and
    samples `next_token(req_id, num_tokens)` when a request's known tokens are all computed."""

    def __init__(self, next_token: Callable[[str, int], int] = by_position) -> None:
        self.next_token = next_token
        self.state: dict[str, dict] = {}

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for rid in out.finished_req_ids:
            self.state.pop(rid, None)
        for new in out.new_reqs:
            assert new.req_id not in self.state
            self.state[new.req_id] = dict(tokens=list(new.token_ids), blocks=list(new.block_ids),
                                          computed=new.num_computed_tokens)
        for cached in out.cached_reqs:
            st = self.state[cached.req_id]
            assert st["computed"] == cached.num_computed_tokens
            st["blocks"] += cached.new_block_ids
        sampled = [self._run(rid, n) for rid, n in out.num_scheduled_tokens.items()]
        return ModelRunnerOutput(req_ids=list(out.num_scheduled_tokens), sampled_token_ids=sampled)

    def _run(self, rid: str, n: int) -> list[int]:
        st = self.state[rid]
        st["computed"] += n
        assert st["computed"] <= len(st["tokens"])
        assert len(st["blocks"]) * BS >= st["computed"]
        if st["computed"] < len(st["tokens"]):
            return []
        token = self.next_token(rid, len(st["tokens"]))
        st["tokens"].append(token)
        return [token]


def step(sched: Scheduler, worker: FakeWorker) -> tuple[SchedulerOutput, list[EngineCoreOutput]]:
    out = sched.schedule()
    return out, sched.update_from_output(out, worker.execute(out))


def run_to_end(sched: Scheduler, worker: FakeWorker,
               max_steps: int = 100) -> list[EngineCoreOutput]:
    outputs: list[EngineCoreOutput] = []
    for _ in range(max_steps):
        if not sched.has_unfinished_requests():
            return outputs
        outputs += step(sched, worker)[1]
    raise AssertionError("requests did not finish")


def scripted(tokens: list[int]) -> FakeWorker:
    it = iter(tokens)
    return FakeWorker(lambda rid, n: next(it))
