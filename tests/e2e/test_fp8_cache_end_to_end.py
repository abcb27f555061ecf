"""`kv_cache_dtype="fp8"` end to end: a tiny Llama generates what transformers does when
its keys (after rotary) and values are rounded through torch's float8 conversion, as an
8-bit cache holds them. Both the torch backend and the Triton one (interpreted on the CPU)."""

import contextlib

import pytest
import torch

from loom import LLM, SamplingParams
from tests.e2e.test_correctness import _prompts

NEW_TOKENS = 6
FP8 = torch.float8_e4m3fn


def _round(x: torch.Tensor) -> torch.Tensor:
    limit = torch.finfo(FP8).max
    return x.clamp(-limit, limit).to(FP8).to(x.dtype)


@contextlib.contextmanager
def hf_fp8_kv(hf):
    """transformers' Llama with every rotated key and every value rounded to float8."""
    from transformers.models.llama import modeling_llama
    original = modeling_llama.apply_rotary_pos_emb

    def rounded(q, k, cos, sin, *args, **kwargs):
        q, k = original(q, k, cos, sin, *args, **kwargs)
        return q, _round(k)
    hooks = [m.v_proj.register_forward_hook(lambda mod, inp, out: _round(out))
             for m in hf.modules() if isinstance(m, modeling_llama.LlamaAttention)]
    modeling_llama.apply_rotary_pos_emb = rounded
    try:
        yield
    finally:
        modeling_llama.apply_rotary_pos_emb = original
        for h in hooks:
            h.remove()


def hf_token_logprobs(hf, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log p(tokens[i] | prompt + tokens[:i]) by one forward over the whole sequence."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = hf(ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


def _generate(path, monkeypatch, triton: bool, **kwargs):
    if triton:
        pytest.importorskip("triton")
        from loom.attention.triton_backend import TritonBackend, TritonTiles
        from loom.kernels.interpreter import patch_interpreter
        from loom.worker import model_runner
        patch_interpreter()
        monkeypatch.setattr(model_runner, "select_backend",
                            lambda device: TritonBackend(TritonTiles(sdpa_max_reqs=0)))
        monkeypatch.setattr(model_runner, "warm_up", lambda runner: None)  # not under test
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
              enable_prefix_caching=False, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True,
                            logprobs=0)
    prompts = _prompts(seed=3, lengths=(7, 30, 19))
    outs = llm.generate(prompts, params, use_tqdm=False)
    llm.shutdown()
    return prompts, [(o.outputs[0].token_ids,
                      torch.tensor([lp[t].logprob for t, lp in zip(o.outputs[0].token_ids,
                                                                  o.outputs[0].logprobs)]))
                     for o in outs]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors; Triton interpreted")
@pytest.mark.parametrize("triton", [False, True], ids=["torch", "triton"])
def test_fp8_cache_generates_what_transformers_does_over_rounded_kv(
        triton, tiny_model_factory, monkeypatch):
    path, hf = tiny_model_factory("llama")
    prompts, got = _generate(path, monkeypatch, triton, kv_cache_dtype="fp8")
    gaps_to_unrounded = []
    for prompt, (tokens, logprobs) in zip(prompts, got):
        with hf_fp8_kv(hf):
            ref = hf_token_logprobs(hf, prompt, tokens)
            assert hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS,
                               do_sample=False, pad_token_id=0, eos_token_id=None,
                               min_new_tokens=NEW_TOKENS)[0, len(prompt):].tolist() == tokens
        torch.testing.assert_close(logprobs, ref, atol=2e-5, rtol=2e-5)
        gaps_to_unrounded.append(float((hf_token_logprobs(hf, prompt, tokens) - ref).abs().max()))
    # The test can tell: full-precision keys and values give other logprobs.
    assert max(gaps_to_unrounded) > 1e-3, gaps_to_unrounded


def test_fp8_cache_holds_twice_the_blocks(tiny_model_factory):
    path, _ = tiny_model_factory("llama")
    blocks = {}
    for dtype in ("auto", "fp8_e5m2"):
        llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu",
                  max_model_len=128, kv_cache_memory_bytes=1 << 20, kv_cache_dtype=dtype)
        blocks[dtype] = llm.engine.num_blocks
        llm.shutdown()
    # float32 elements are 4 bytes, 8-bit ones 1.
    assert blocks["fp8_e5m2"] == 4 * blocks["auto"], blocks


def test_bad_kv_cache_dtype_is_a_clear_error(tiny_model_factory):
    path, _ = tiny_model_factory("llama")
    with pytest.raises(ValueError, match="kv_cache_dtype: 'int4' is not one of"):
        LLM(path, skip_tokenizer_init=True, device="cpu", kv_cache_dtype="int4")
