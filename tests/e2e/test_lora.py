"""LoRA adapters end to end: loom's greedy tokens and logprobs equal peft's (the adapter
applied by the library that trained it) for every request of a batch that mixes adapters
and the base model, under each scheduling mode, compiled, and over two TP ranks."""

from __future__ import annotations

import os
import random
import shutil

import pytest

from loom import LLM, SamplingParams
from loom.lora.adapter import WEIGHTS_FILE
from loom.lora.request import LoRARequest
from tests.conftest import hf_greedy
from tests.lora_util import cut_short, make_adapter, poison

pytest.importorskip("peft")

ATTENTION = ("q_proj", "v_proj")


@pytest.fixture(scope="module")
def adapters(tiny_model_factory, tmp_path_factory):
    """kind -> (base path, base model, [(LoRARequest, peft model)]): one adapter on every
    projection (rank 8) and one on q and v only (rank 4, rsLoRA)."""
    cache = {}

    def get(kind: str):
        if kind not in cache:
            path, hf = tiny_model_factory(kind)
            made = []
            for i, (targets, r, rs) in enumerate([(None, 8, False), (ATTENTION, 4, True)]):
                out = str(tmp_path_factory.mktemp(f"{kind}-lora{i}"))
                kw = {} if targets is None else {"targets": targets}
                peft_model = make_adapter(path, out, r=r, alpha=2 * r, seed=10 + i,
                                          use_rslora=rs, **kw)
                made.append((LoRARequest(f"lora{i}", i + 1, out), peft_model))
            cache[kind] = (path, hf, made)
        return cache[kind]
    return get


def _prompts() -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(3, 256) for _ in range(n)] for n in (6, 19, 40)]


def _llm(path: str, **kwargs) -> LLM:
    kwargs.setdefault("max_model_len", 128)
    return LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", enable_lora=True,
               max_lora_rank=8, **kwargs)


def _greedy(n: int = 12, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)


def _mixed(made):
    """Every prompt with the base model and with each adapter, interleaved in one batch;
    the models that define each request's tokens."""
    batch = []
    for prompt in _prompts():
        batch.append((prompt, None, None))
        batch.extend((prompt, lora, model) for lora, model in made)
    return batch


@pytest.mark.parametrize("engine_kwargs", [
    dict(max_loras=2), dict(max_loras=1), dict(max_loras=2, async_scheduling=False),
    dict(max_loras=2, max_num_batched_tokens=16),
], ids=["two-slots", "one-slot", "sync", "small-budget"])
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_mixed_batch_equals_peft(kind, engine_kwargs, adapters):
    path, hf, made = adapters(kind)
    batch = _mixed(made)
    outs = _llm(path, **engine_kwargs).generate([p for p, _, _ in batch], _greedy(),
                                                lora_request=[lo for _, lo, _ in batch],
                                                use_tqdm=False)
    for (prompt, _, model), out in zip(batch, outs):
        assert out.outputs[0].token_ids == hf_greedy(model or hf, prompt, 12)
    # The adapters change what is generated (else the test could not fail).
    assert len({tuple(o.outputs[0].token_ids) for o in outs[:3]}) == 3


def test_logprobs_equal_peft(adapters):
    import torch
    path, _, made = adapters("llama")
    lora, model = made[0]
    prompt = _prompts()[1]
    out = _llm(path).generate([prompt], _greedy(6, logprobs=4), lora_request=lora,
                              use_tqdm=False)[0].outputs[0]
    with torch.no_grad():
        ref = model(torch.tensor([prompt + out.token_ids])).logits[0].float().log_softmax(-1)
    for j, (token, position) in enumerate(zip(out.token_ids, out.logprobs)):
        row = ref[len(prompt) + j - 1]
        assert position[token].logprob == pytest.approx(row[token].item(), abs=1e-4)
        assert set(position) == {token, *row.topk(4).indices.tolist()}


def test_bfloat16_model(adapters):
    """The slots take the model's dtype and device (they were float32 on the CPU: a bf16
    GPU model failed its first LoRA step): in bf16 the adapter's first logprobs stay
    within bf16 rounding of peft's float32 ones."""
    import torch
    path, _, made = adapters("llama")
    lora, model = made[0]
    prompt = _prompts()[1]
    llm = LLM(path, skip_tokenizer_init=True, dtype="bfloat16", device="cpu",
              enable_lora=True, max_lora_rank=8, max_model_len=128)
    out = llm.generate([prompt], _greedy(1, logprobs=4), lora_request=lora,
                       use_tqdm=False)[0].outputs[0]
    llm.shutdown()
    with torch.no_grad():
        ref = model(torch.tensor([prompt])).logits[0, -1].float().log_softmax(-1)
    for token, lp in out.logprobs[0].items():
        assert lp.logprob == pytest.approx(ref[token].item(), abs=0.15)


def test_prefix_cache_is_kept_apart_per_adapter(adapters):
    """The base model's cached prompt blocks are not reused for an adapter's request (its
    KV differs), while a second request of the same adapter hits its own."""
    path, hf, made = adapters("llama")
    lora, model = made[0]
    prompt = _prompts()[2]  # 40 tokens: two full blocks
    llm = _llm(path)
    base = llm.generate([prompt], _greedy(), use_tqdm=False)[0]
    first = llm.generate([prompt], _greedy(), lora_request=lora, use_tqdm=False)[0]
    again = llm.generate([prompt], _greedy(), lora_request=lora, use_tqdm=False)[0]
    assert base.outputs[0].token_ids == hf_greedy(hf, prompt, 12)
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == hf_greedy(model, prompt, 12)
    assert first.num_cached_tokens == 0 and again.num_cached_tokens == 32


def test_adapters_beyond_the_slots_take_turns(adapters, monkeypatch):
    """max_loras=1 with two adapters: no step ever mixes them, yet every request finishes
    with its own adapter's tokens, and base-model requests run beside either."""
    from loom.lora.manager import LoRAManager
    path, hf, made = adapters("llama")
    seen, prepare = [], LoRAManager.prepare
    monkeypatch.setattr(LoRAManager, "prepare", lambda self, loras, *a: (
        seen.append({lo.lora_int_id for lo in loras if lo is not None}),
        prepare(self, loras, *a))[1])
    batch = _mixed(made)
    outs = _llm(path, max_loras=1).generate([p for p, _, _ in batch], _greedy(),
                                            lora_request=[lo for _, lo, _ in batch],
                                            use_tqdm=False)
    for (prompt, _, model), out in zip(batch, outs):
        assert out.outputs[0].token_ids == hf_greedy(model or hf, prompt, 12)
    assert max(len(ids) for ids in seen) == 1 and set().union(*seen) == {1, 2}


def test_level3_compiled(adapters):
    path, hf, made = adapters("llama")
    batch = _mixed(made)
    llm = _llm(path, max_loras=2, max_num_batched_tokens=64,
               compilation_config={"level": 3, "compile_sizes": [3]})
    outs = llm.generate([p for p, _, _ in batch], _greedy(6),
                        lora_request=[lo for _, lo, _ in batch], use_tqdm=False)
    for (prompt, _, model), out in zip(batch, outs):
        assert out.outputs[0].token_ids == hf_greedy(model or hf, prompt, 6)


@pytest.mark.slow
@pytest.mark.parametrize("compilation", [
    None, {"level": 3, "pass_config": {"enable_sequence_parallelism": True}},
    {"level": 3, "pass_config": {"enable_async_tp": True}}],
    ids=["eager", "sequence-parallel", "async-tp"])
def test_tensor_parallel(compilation, adapters, monkeypatch):
    """Two ranks: column-parallel layers shard B's rows, row-parallel ones A's columns (their
    term joins the partial sums before the reduction, which sequence parallelism still
    rewrites into a reduce-scatter; async TP then overlaps the all-gathers, loom's overlap
    ops standing in on the CPU)."""
    monkeypatch.setenv("LOOM_ASYNC_TP_IMPL", "overlap")
    monkeypatch.setenv("LOOM_ASYNC_TP_MIN_TOKENS", "16")
    path, hf, made = adapters("llama")
    batch = _mixed(made)
    llm = _llm(path, max_loras=2, tensor_parallel_size=2, compilation_config=compilation,
               max_num_batched_tokens=128)
    try:
        outs = llm.generate([p for p, _, _ in batch], _greedy(),
                            lora_request=[lo for _, lo, _ in batch], use_tqdm=False)
    finally:
        llm.shutdown()
    for (prompt, _, model), out in zip(batch, outs):
        assert out.outputs[0].token_ids == hf_greedy(model or hf, prompt, 12)


def test_moe_model_attention_adapter(tiny_model_factory, tmp_path):
    """Qwen3-MoE: attention adapters apply; its expert layers take none."""
    path, hf = tiny_model_factory("qwen3_moe")
    model = make_adapter(path, str(tmp_path), targets=ATTENTION, r=4, alpha=8)
    lora = LoRARequest("attn", 1, str(tmp_path))
    prompt = _prompts()[0]
    out = _llm(path).generate([prompt], _greedy(), lora_request=lora, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == hf_greedy(model, prompt, 12)
    assert out.outputs[0].token_ids != hf_greedy(hf, prompt, 12)


@pytest.mark.parametrize("engine_kwargs", [
    dict(speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                             "prompt_lookup_max": 2, "prompt_lookup_min": 1}),
    dict(kv_cache_memory_bytes=10 * 16 * 2 * 2 * 16 * 4 * 2, kv_headroom_tokens=0),
], ids=["spec-decode", "preemption"])
def test_mixed_batch_with_drafts_or_preemption(engine_kwargs, adapters, monkeypatch):
    """Draft rows take their request's adapter; a preempted request resumes with it."""
    from loom.core.scheduler import Scheduler
    preempted, preempt = [], Scheduler._preempt
    monkeypatch.setattr(Scheduler, "_preempt",
                        lambda self, req: (preempted.append(req.lora_request), preempt(self, req)))
    path, hf, made = adapters("llama")
    batch = _mixed(made) + [([7, 8, 9] * 6, lo, m) for _, lo, m in _mixed(made)[:3]]
    outs = _llm(path, max_loras=2, **engine_kwargs).generate(
        [p for p, _, _ in batch], _greedy(), lora_request=[lo for _, lo, _ in batch],
        use_tqdm=False)
    for (prompt, _, model), out in zip(batch, outs):
        assert out.outputs[0].token_ids == hf_greedy(model or hf, prompt, 12)
    assert bool(preempted) == ("kv_cache_memory_bytes" in engine_kwargs)
    if preempted:
        assert any(lo is not None for lo in preempted)


def test_beam_search_with_an_adapter_equals_the_merged_model(adapters, tmp_path):
    """peft's merge_and_unload folds the adapter into the weights: beam search over the
    merged model (no LoRA) is what beam search with the adapter must give."""
    from loom.beam_search import BeamSearchParams
    path, _, made = adapters("llama")
    lora, model = made[1]
    import copy
    copy.deepcopy(model).merge_and_unload().save_pretrained(str(tmp_path))
    params = BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True)
    prompts = _prompts()[:2]
    with_lora = _llm(path).beam_search(prompts, params, lora_request=[lora, None])
    merged = LLM(str(tmp_path), skip_tokenizer_init=True, dtype="float32", device="cpu",
                 max_model_len=128).beam_search(prompts[:1], params)
    base = _llm(path).beam_search(prompts[1:], params)
    assert [s.tokens for s in with_lora[0].sequences] == [s.tokens for s in merged[0].sequences]
    assert [s.tokens for s in with_lora[1].sequences] == [s.tokens for s in base[0].sequences]


def test_host_cache_evicts_and_reloads(adapters, monkeypatch):
    """max_cpu_loras=1 with two adapters: each load evicts the other from host memory, so
    taking turns reloads them, and every request still gets its own adapter's tokens."""
    from loom.lora.manager import LoRAManager
    path, hf, made = adapters("llama")
    loads, load = [], LoRAManager._load
    monkeypatch.setattr(LoRAManager, "_load", lambda self, lora: (
        loads.append(lora.lora_int_id), load(self, lora))[1])
    llm = _llm(path, max_loras=1, max_cpu_loras=1)
    for _ in range(2):
        for lora, model in made:
            prompt = _prompts()[0]
            out = llm.generate([prompt], _greedy(4), lora_request=lora, use_tqdm=False)[0]
            assert out.outputs[0].token_ids == hf_greedy(model, prompt, 4)
    assert loads == [1, 2, 1, 2]


def _broken_copy(lora: LoRARequest, out_dir: str) -> LoRARequest:
    """A copy with one NaN weight: the checks before the engine cannot see it (they read
    the header only), the workers' load refuses it."""
    return LoRARequest("broken", 3, poison(shutil.copytree(lora.lora_path, out_dir)))


def test_a_truncated_adapter_is_refused_before_any_request_runs(adapters, tmp_path):
    path, _, ((good, _), _) = adapters("llama")
    cut = LoRARequest("cut", 4, cut_short(shutil.copytree(good.lora_path, str(tmp_path / "cut"))))
    llm = _llm(path)
    try:
        with pytest.raises(ValueError, match=r"^lora_request 'cut' \(.*\): adapter_model."
                                             r"safetensors is truncated: "):
            llm.generate([_prompts()[0]] * 2, _greedy(), lora_request=[None, cut])
        assert not llm.engine.has_unfinished_requests()
    finally:
        llm.shutdown()


@pytest.mark.parametrize("engine_kwargs", [
    dict(), pytest.param(dict(tensor_parallel_size=2), marks=pytest.mark.slow)],
    ids=["one-rank", "tp2"])
def test_an_adapter_that_fails_to_load_ends_only_its_requests(engine_kwargs, adapters,
                                                              tmp_path):
    """A batch of the base model, a good adapter and one with a NaN weight (which, loaded,
    would reach every row of the batch): the broken adapter's requests end with an error
    naming it, the others as peft computes them. Repaired, it loads at its next request,
    and the prefix-cache blocks its failed requests wrote (without the adapter) serve
    nothing."""
    path, hf, ((good, good_model), (source, model)) = adapters("llama")
    broken = _broken_copy(source, str(tmp_path / "broken"))
    batch = [(p, lora) for p in _prompts()[::2] for lora in (None, good, broken)]
    llm = _llm(path, max_loras=2, **engine_kwargs)
    try:
        outs = llm.generate([p for p, _ in batch], _greedy(8),
                            lora_request=[lora for _, lora in batch], use_tqdm=False)
        shutil.copy(os.path.join(source.lora_path, WEIGHTS_FILE), broken.lora_path)
        prompt = _prompts()[2]  # two full blocks, cached by the failed request too
        again = llm.generate([prompt], _greedy(), lora_request=broken, use_tqdm=False)[0]
    finally:
        llm.shutdown()
    for (prompt_ids, lora), out in zip(batch, outs):
        completion = out.outputs[0]
        if lora is broken:
            assert (completion.finish_reason, completion.token_ids) == ("error", [])
            assert completion.error.startswith(f"lora_request 'broken' ({broken.lora_path}): "
                                               "the adapter could not be loaded: "), completion
        else:
            assert completion.error is None
            assert completion.token_ids == hf_greedy(good_model if lora else hf, prompt_ids, 8)
    assert again.outputs[0].token_ids == hf_greedy(model, prompt, 12)


def test_a_failure_reported_again_by_a_step_run_ahead_ends_nothing_new(adapters, tmp_path):
    """A request alone with a broken adapter ends with the error, and generate returns with
    its next decode, which ran ahead, still in flight: that step's report of the same
    failure does not end the next request, which finds the adapter repaired."""
    path, _, (_, (source, model)) = adapters("llama")
    broken = _broken_copy(source, str(tmp_path / "broken"))
    prompt = _prompts()[0]
    llm = _llm(path)
    failed = llm.generate([prompt], _greedy(), lora_request=broken, use_tqdm=False)[0]
    assert llm.engine._in_flight  # (else this tests nothing)
    shutil.copy(os.path.join(source.lora_path, WEIGHTS_FILE), broken.lora_path)
    again = llm.generate([prompt], _greedy(), lora_request=broken, use_tqdm=False)[0]
    assert failed.outputs[0].finish_reason == "error"
    assert again.outputs[0].token_ids == hf_greedy(model, prompt, 12)
