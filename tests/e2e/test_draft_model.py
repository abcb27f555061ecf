"""Speculative decoding with a draft model (vLLM's method "draft_model").

Whatever the draft model proposes, greedy outputs equal transformers'. The sharp check of
the drafter's own KV cache is a draft that is the target itself: its argmax is the
target's, so every draft must be accepted, and one wrong key or value (a position the
drafter skipped, a slot past the block table, a prefix-cache hit whose draft KV was never
written, a preempted request's stale drafts) shows as a rejection."""

from __future__ import annotations

import pytest

from loom import LLM, SamplingParams
from tests.conftest import TINY, hf_greedy
from tests.e2e.test_spec_decode import _greedy, _prompts


def _spec(draft: str, k: int = 3) -> dict:
    return {"method": "draft_model", "model": draft, "num_speculative_tokens": k}


def _llm(path: str, draft: str, **kwargs) -> LLM:
    kwargs.setdefault("max_model_len", 256)
    return LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu",
               speculative_config=_spec(draft, kwargs.pop("k", 3)), **kwargs)


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory):
    """A tiny Qwen3 of other random weights whose vocabulary is padded past the target's
    (drafts must still be ids the target holds)."""
    import torch
    import transformers as tf
    torch.manual_seed(1)
    path = str(tmp_path_factory.mktemp("draft-qwen3"))
    tf.AutoModelForCausalLM.from_config(tf.Qwen3Config(**dict(TINY, vocab_size=320)),
                                        dtype=torch.float32).save_pretrained(path)
    return path


@pytest.mark.parametrize("engine_kwargs", [
    {}, dict(async_scheduling=False), dict(max_num_batched_tokens=16, k=4),
    # blocks run out mid-decode (each block holds both models' KV): requests are preempted
    dict(kv_cache_memory_bytes=2 * 2 * 2 * 16 * 2 * 16 * 4 * 14, max_model_len=160,
         kv_headroom_tokens=0),
], ids=["default", "sync", "small-budget", "preemption"])
def test_a_draft_of_the_target_itself_is_always_accepted(engine_kwargs, tiny_model_factory,
                                                         verified, monkeypatch):
    from loom.core.scheduler import Scheduler
    preempted, preempt = [], Scheduler._preempt
    monkeypatch.setattr(Scheduler, "_preempt",
                        lambda self, req: (preempted.append(req.request_id), preempt(self, req)))
    path, hf = tiny_model_factory("llama")
    prompts = _prompts()
    llm = _llm(path, path, **engine_kwargs)
    outs = llm.generate(prompts, _greedy(40), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 40)
    steps, drafted, accepted = verified
    assert steps > 0 and drafted > steps and accepted == drafted
    assert bool(preempted) == ("kv_cache_memory_bytes" in engine_kwargs)
    if engine_kwargs:
        return
    # Again: the prompts now hit the prefix cache, whose blocks hold the draft's KV too.
    again = llm.generate(prompts, _greedy(40), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in outs]
    assert all(o.num_cached_tokens > 0 for o in again if len(o.prompt_token_ids) > 16)
    assert verified[2] == verified[1] > drafted


def test_outputs_end_where_they_would_without_drafts(tiny_model_factory, verified):
    path, hf = tiny_model_factory("llama")
    prompts = _prompts()[4:]
    refs = [hf_greedy(hf, p, 40) for p in prompts]
    llm = _llm(path, path, k=4)
    for n in (1, 2, 3, 6):
        outs = llm.generate(prompts, _greedy(n), use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == [r[:n] for r in refs]
    for prompt, ref in zip(prompts, refs):  # a stop token among accepted drafts
        stop = ref[30]
        out = llm.generate([prompt], _greedy(40, stop_token_ids=[stop]), use_tqdm=False)[0]
        assert out.outputs[0].token_ids == ref[:ref.index(stop) + 1]
        assert out.outputs[0].finish_reason == "stop"
    # max_model_len ends a request mid-draft; the drafts' slots never pass the table.
    out = _llm(path, path, max_model_len=60, k=4).generate(
        [prompts[0]], SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True),
        use_tqdm=False)[0]
    assert out.outputs[0].token_ids == refs[0][:60 - len(prompts[0])]
    assert verified[2] == verified[1] > 0


@pytest.mark.parametrize("draft_tp", [None, 2], ids=["whole-on-driver", "sharded"])
def test_tensor_parallel_target_with_its_draft(draft_tp, tiny_model_factory, verified):
    """TP=2 on gloo. By default the driver rank holds the whole draft model (no collective
    of its own) beside its shard of the target, and the other rank holds none and follows
    the verified tokens; with draft_tensor_parallel_size 2 each rank holds a shard of the
    draft too, and both run it. Every draft of the target's own weights is kept."""
    path, hf = tiny_model_factory("llama")
    prompts = _prompts()[3:]
    # A block of one rank's target shard: K and V x 1 KV head x 16 x 4 bytes x 16 tokens x
    # 2 layers. The driver adds its draft's: a shard (the same), or the whole (twice it).
    shard = 2 * 1 * 16 * 4 * 16 * 2
    budget = 40 * 2 * shard
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu",
              max_model_len=256, tensor_parallel_size=2, kv_cache_memory_bytes=budget,
              speculative_config=dict(_spec(path), draft_tensor_parallel_size=draft_tp))
    try:
        outs = llm.generate(prompts, _greedy(30), use_tqdm=False)
        assert llm.engine.num_blocks == budget // (shard * (2 if draft_tp else 3))
    finally:
        llm.shutdown()
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 30)
    assert verified[2] == verified[1] > verified[0]


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_the_next_step_is_launched_before_a_steps_outputs_return(async_scheduling,
                                                                 tiny_model_factory,
                                                                 monkeypatch):
    """A draft model's requests never run ahead of a step, so under async scheduling the
    engine launches the next one as soon as a step is collected, before its outputs are
    returned and processed; without async scheduling, never."""
    from loom.engine.core import EngineCore
    in_flight, step = [], EngineCore.step
    monkeypatch.setattr(EngineCore, "step", lambda self: (
        out := step(self), in_flight.append((len(self._in_flight),
                                             self.scheduler.has_unfinished_requests())))[0])
    path, hf = tiny_model_factory("llama")
    prompts = _prompts()[:2]
    llm = _llm(path, path, async_scheduling=async_scheduling)
    outs = llm.generate(prompts, _greedy(20), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 20)
    busy = [n for n, unfinished in in_flight if unfinished]
    assert len(busy) > 3 and set(busy) == ({1} if async_scheduling else {0})


def test_another_draft_model_changes_no_greedy_token(tiny_model_factory, other_draft, verified):
    """A Qwen3 drafting for a Llama: its drafts are mostly rejected, the outputs are the
    target's; random sampling, logprobs and penalties run beside it."""
    path, hf = tiny_model_factory("llama")
    prompts = _prompts()
    llm = _llm(path, other_draft, k=4)
    outs = llm.generate(prompts, _greedy(30, logprobs=2), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 30)
        assert len(out.outputs[0].logprobs) == 30
    assert verified[1] > 0
    mixed = [SamplingParams(temperature=0.8, seed=3, max_tokens=30, ignore_eos=True, n=2),
             _greedy(30, repetition_penalty=1.3)]
    outs = llm.generate(prompts[:2], mixed, use_tqdm=False)
    assert all(len(c.token_ids) == 30 and max(c.token_ids) < 256
               for o in outs for c in o.outputs)


@pytest.mark.parametrize("spec,message", [
    ({"method": "draft_model", "num_speculative_tokens": 2},
     "speculative_config.model: required for method draft_model"),
    ({"model": "x", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
     "speculative_config.prompt_lookup_max: is an n-gram setting, not draft_model's"),
    ({"model": "x", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2},
     "speculative_config.draft_tensor_parallel_size: 1 (the whole draft model on the "
     "driver's GPU) or the target's tensor_parallel_size (1), got 2"),
    ({"model": "x", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 0},
     "speculative_config.draft_tensor_parallel_size: a positive integer, got 0"),
])
def test_config_errors_name_the_field(spec, message):
    from loom.engine.arg_utils import EngineArgs
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        EngineArgs(model="llama-3.1-8b", speculative_config=spec).create_engine_config()


def test_engine_errors_name_the_draft(tiny_model_factory, tmp_path):
    from loom.speculative_config import SpeculativeConfig
    assert SpeculativeConfig.parse({"model": "/d", "num_speculative_tokens": 2}).method == \
        "draft_model"
    path, _ = tiny_model_factory("llama")
    with pytest.raises(ValueError, match=f"speculative_config.model: '{tmp_path}/none'"):
        _llm(path, f"{tmp_path}/none")
    import torch
    import transformers as tf
    torch.manual_seed(0)
    bert = tmp_path / "bert"
    tf.BertModel(tf.BertConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=1, num_attention_heads=4,
                               max_position_embeddings=512)).save_pretrained(bert)
    with pytest.raises(ValueError, match="is not a causal LM: a draft model must generate"):
        _llm(path, str(bert))
    with pytest.raises(ValueError, match=r"^speculative_config.model: '.*': max_model_len: "
                                         r"1024 exceeds the model's context length \(512\)"):
        _llm(path, path, max_model_len=1024, hf_overrides={"max_position_embeddings": 2048})


def test_the_drafts_one_token_forwards_replay_cuda_graphs(tiny_model_factory, verified,
                                                         monkeypatch, caplog):
    """Where the target captures decode graphs, the drafter captures its one-token forwards
    at the same sizes, and its forwards over a step's kept tokens in mixed graphs (played on
    the CPU by test_full_graphs' stand-in graph): padded batches replay them, and every
    draft is still accepted."""
    import logging

    import torch

    from loom.worker import drafter, model_runner
    from tests.worker.test_full_graphs import _capturing, _Graph, _Runner
    monkeypatch.setattr(model_runner, "cuda_graphs_on", lambda device: True)
    monkeypatch.setattr(model_runner.ModelRunner, "decode_graph_sizes", lambda self: [1, 2, 4, 8])
    for module in (model_runner, drafter):
        monkeypatch.setattr(module, "CUDAGraphRunner", _Runner)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", _capturing)
    caplog.set_level(logging.INFO, logger="loom")
    queries, run_mixed = [], _Runner.run_mixed
    monkeypatch.setattr(_Runner, "run_mixed", lambda self, batch, size: (
        queries.append((self.name, batch.attn_metadata.max_query_len)),
        run_mixed(self, batch, size))[1])
    path, hf = tiny_model_factory("llama")
    prompts = _prompts()
    llm = _llm(path, path, compilation_config={"level": 0}, k=4)
    outs = llm.generate(prompts, _greedy(30), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 30)
    assert verified[2] == verified[1] > verified[0]
    graphs = llm.engine.executor.worker.model_runner.drafter.graphs
    # The kept tokens' forwards: up to (k + 2) x 8 = 48 tokens, in mixed graphs to 64.
    assert sorted(graphs.graphs) == [1, 2, 4, 8] and sorted(graphs.mixed_graphs) == [8, 16, 32, 64]
    assert "draft model: captured 4 CUDA graphs (decode batch sizes 1..8) and 4 of mixed " \
        "batches (8..64 tokens)" in caplog.text
    replays = {size: g.replays for size, (g, _) in graphs.graphs.items()}
    assert replays[8] > 0 and sum(replays.values()) >= 3 * verified[0] // len(prompts)
    mixed = sum(g.replays for g, _ in graphs.mixed_graphs.values())
    assert mixed >= verified[0] // len(prompts)  # each decode step's first draft forward
    # The target's verify steps (1 + k = 5 tokens a request) replay whole-forward graphs
    # under the default FULL_AND_PIECEWISE, as vLLM's uniform-decode ones (that longer
    # queries do not is test_full_graphs' test_mixed_graphs_hold_what_fits).
    target = llm.engine.executor.worker.model_runner.graph_runner
    assert sorted(target.mixed_graphs) == [8, 16, 32, 64]  # 8 requests x 5 tokens: 40
    verify = [q for name, q in queries if not name]
    assert len(verify) >= verified[0] // len(prompts) and max(verify) == 5
    assert sum(g.replays for g, _ in target.mixed_graphs.values()) == len(verify)
