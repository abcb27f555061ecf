"""Priority scheduling end to end on a tiny model: under KV pressure (preemptions), every
request still gets transformers' greedy tokens, and higher-priority requests finish first."""

from __future__ import annotations

import random

import pytest

from loom import LLM, SamplingParams
from tests.conftest import hf_greedy

PRIORITIES = [2, 1, 0, 0, 1, 2]


def test_priority_order_and_greedy_identity(tiny_model_factory, monkeypatch):
    path, hf = tiny_model_factory("llama")
    from loom.core.scheduler import Scheduler
    preempted, finished_at, steps = [], {}, [0]
    original_preempt, original_update = Scheduler._preempt, Scheduler.update_from_output

    def update(self, sched_out, runner_out):
        steps[0] += 1
        outputs = original_update(self, sched_out, runner_out)
        finished_at.update({o.request_id: steps[0] for o in outputs if o.finish_reason})
        return outputs
    monkeypatch.setattr(Scheduler, "_preempt",
                        lambda self, req: (preempted.append(req.priority),
                                           original_preempt(self, req)))
    monkeypatch.setattr(Scheduler, "update_from_output", update)
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 256) for _ in range(n)] for n in (40, 25, 33, 47, 30, 41)]
    # 8 blocks of 16 tokens: three requests of up to 67 tokens do not fit together.
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
              kv_cache_memory_bytes=2 * 2 * 16 * 2 * 16 * 4 * 8, kv_headroom_tokens=0,
              max_num_seqs=3, scheduling_policy="priority")
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False, priority=PRIORITIES)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 20)
    assert preempted, "the KV budget was meant to force preemptions"
    done = [finished_at[o.request_id] for o in outs]
    for i, j in [(i, j) for i in range(6) for j in range(6) if PRIORITIES[i] < PRIORITIES[j]]:
        assert done[i] <= done[j], (done, PRIORITIES)
    assert max(done[i] for i in (2, 3)) < min(done[i] for i in (0, 5))
    with pytest.raises(ValueError, match="^priority: must be a list of one integer per prompt"):
        llm.generate(prompts[:2], params, use_tqdm=False, priority=[0])
    with pytest.raises(ValueError, match="^priority: must be an integer"):
        llm.generate(prompts[:1], params, use_tqdm=False, priority=["0"])
