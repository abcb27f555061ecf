"""int8 W8A8 checkpoints (compressed-tensors' int-quantized format, llm-compressor's W8A8
scheme) against compressed-tensors' own fake quantization, as transformers runs them, on
the CPU.

Layer by layer, each of loom's int8 layers given the same input rows computes what the
checkpoint's quantized Linear modules compute, to float32 rounding: the int8 weights and
scales as loaded, the activations quantized alike (amax / 127.5 per token, or the static
scale; clamped, rounded half to even). That check is exact because the rows are the same.
Over a whole model the rows reaching a layer differ from transformers' by float32 rounding
(the order of sums), and a value within that of a rounding boundary lands one int8 step
apart: one value in a few thousand in these tiny models, which moved a prompt's logprobs
by up to 0.016 here (most prompts agree within 2e-6). So the whole-model check holds the
greedy tokens equal and the logprobs within 0.05, where int8 itself moves them by 0.07-0.3
(the unquantized model's).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from loom import LLM, SamplingParams
from loom.models.weights import checkpoint_modules
from loom.quantization.fp8 import INT8, quantize_rows
from tests.conftest import hf_greedy, hf_last_logprobs, make_tiny_model
from tests.quantization.test_fp8_loading import _assert_matches, _linear_layers, _load

pytest.importorskip("compressed_tensors")

from tests.quantization.fp8_checkpoints import (checkpoint_cache,  # noqa: E402
                                                tp_reference, write_fp8_checkpoint)

PROMPTS = [[1, 5, 9, 33, 7, 100, 200, 3], [4, 44, 144, 240, 17, 9, 9, 30, 31, 2, 77], [8, 8]]
NEW_TOKENS = 8

CASES = {  # id -> (model kind, scheme, ignored modules)
    "llama-dynamic": ("llama", "int8-dynamic", ["lm_head", "re:.*layers.1.mlp.down_proj"]),
    "qwen2-static": ("qwen2", "int8-static", ["lm_head"]),
    # loom computes a dynamic per-tensor scale per token (as for fp8)
    "qwen3-tensor-dynamic": ("qwen3", "int8-tensor-dynamic", ["lm_head"]),
    "phi3-static": ("phi3", "int8-static", ["lm_head"]),  # fused qkv_proj / gate_up_proj
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """case id -> (int8 checkpoint path, transformers' reading of it, unquantized path and
    model)."""
    return checkpoint_cache(tmp_path_factory, CASES)


def _rows(n: int, k: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(n * 1000 + k)
    x = torch.randn(n, k, generator=gen) * 2
    x[1, 3] = 30.0  # one row with a far larger range than the others
    return x


@pytest.mark.parametrize("case", list(CASES))
def test_each_layer_computes_what_compressed_tensors_does(case, checkpoints):
    path, reference, _, _ = checkpoints(case)
    model = _load(path, dtype="float32")
    with torch.no_grad():  # transformers decompresses a module's weight at its first call
        reference(torch.tensor([PROMPTS[0]]))
    checked = 0
    for name, layer in _linear_layers(model).items():
        parts = checkpoint_modules(name)
        modules = [reference.get_submodule(p) for p in parts
                   if p in dict(reference.named_modules())] or [reference.get_submodule(name)]
        if layer.quant is None:
            assert layer.weight.dtype == torch.float32, name  # the ignore list's
            continue
        assert layer.weight.dtype == INT8 and layer.quant.dtype == INT8, name
        x = _rows(5, layer.in_features)
        with torch.no_grad():
            # [batch, tokens, features]: compressed-tensors' per-token scales want a batch
            want = torch.cat([m(x[None])[0] for m in modules], dim=-1)
            got = layer(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")
        checked += 1
    assert checked >= 6


def _generate(llm: LLM):
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True,
                            logprobs=256)
    try:
        return llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        llm.shutdown()


def _compare(outs, reference, unquantized=None) -> None:
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == hf_greedy(reference, prompt, NEW_TOKENS)
        ours = torch.tensor([out.outputs[0].logprobs[0][t].logprob for t in range(256)])
        diff = (ours - hf_last_logprobs(reference, prompt)).abs()
        assert diff.max() < 0.05, diff.max()
        if unquantized is not None:  # the check can fail: int8 moves the logprobs more
            moved = (hf_last_logprobs(reference, prompt)
                     - hf_last_logprobs(unquantized, prompt)).abs()
            assert moved.max() > 0.05, moved.max()


def _llm(path: str, **kwargs) -> LLM:
    return LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
               max_logprobs=-1, **kwargs)


@pytest.mark.parametrize("case", list(CASES))
def test_int8_checkpoint_matches_compressed_tensors(case, checkpoints):
    path, reference, _, unquantized = checkpoints(case)
    _compare(_generate(_llm(path)), reference, unquantized)


def test_tensor_parallel(checkpoints):
    """TP=2 on gloo: each row-parallel rank scales its own half of a token's features,
    which compressed-tensors runs as per-group activation scales (groups of half the
    width)."""
    path, _, base, _ = checkpoints("llama-dynamic")
    kind, scheme, ignore = CASES["llama-dynamic"]
    _compare(_generate(_llm(path, tensor_parallel_size=2)),
             tp_reference(make_tiny_model(kind, base), 2, ignore, scheme))


def test_dummy_weights_are_quantized_per_channel(tiny_model_factory, tmp_path):
    """Dummy weights for an int8 checkpoint's config (benchmarks of W8A8 shapes): each
    layer's values drawn as the unquantized model's, then quantized to int8 per channel."""
    path, _ = tiny_model_factory("llama")
    config = json.loads((Path(path) / "config.json").read_text())
    config["quantization_config"] = json.loads(
        (Path(__file__).parent.parent.parent / "loom/bench/configs/llama-3.1-8b-w8a8.json")
        .read_text())["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    plain = _load(path, dtype="bfloat16", load_format="dummy")
    int8 = _load(str(tmp_path), dtype="bfloat16", load_format="dummy")
    expected = {n: quantize_rows(m.weight.data, INT8) for n, m in _linear_layers(plain).items()}
    _assert_matches(int8, plain, expected, INT8)


def test_dummy_int8_experts(tiny_model_factory, tmp_path):
    """Dummy weights for an int8 MoE config (qwen3-30b-a3b-w8a8): each expert's values drawn
    as the unquantized model's, then rounded to 8 bits per row in loom's packed layout."""
    from loom.quantization.int4 import quantize_int4
    path, _ = tiny_model_factory("qwen3_moe")
    config = json.loads((Path(path) / "config.json").read_text())
    config["quantization_config"] = json.loads(
        (Path(__file__).parent.parent.parent / "loom/bench/configs/qwen3-30b-a3b-w8a8.json")
        .read_text())["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    name = "model.layers.0.mlp.experts"
    plain = _load(path, dtype="bfloat16", load_format="dummy").get_submodule(name)
    int8 = _load(str(tmp_path), dtype="bfloat16", load_format="dummy").get_submodule(name)
    for attr in ("w13", "w2"):
        want = [quantize_int4(w, w.shape[1], False, 8) for w in getattr(plain, attr)]
        assert torch.equal(getattr(int8, attr), torch.stack([q for q, _, _ in want]))
        assert torch.equal(getattr(int8, attr + "_scale"), torch.stack([s for _, s, _ in want]))


def _with_int8_experts(path: str, dest: Path) -> tuple[str, str]:
    """(path with every MoE expert weight int8 and its per-row scale beside it, as a W8A8
    checkpoint of per-expert Linear modules has them; path with the same experts
    dequantized in float32: the reference's). compressed-tensors leaves transformers' fused
    experts unquantized, so they are quantized here, as compressed-tensors quantizes a
    weight (amax / 127.5, rounded half to even)."""
    import shutil

    from safetensors.torch import load_file, save_file
    int8, dequantized = dest / "int8-experts", dest / "dequantized"
    for out in (int8, dequantized):
        shutil.copytree(path, out)
    tensors = load_file(Path(path) / "model.safetensors")
    q8, ref = dict(tensors), dict(tensors)
    experts = [n for n in tensors if ".mlp.experts." in n and n.endswith("_proj.weight")]
    assert experts
    for name in experts:
        q, scale = quantize_rows(tensors[name], INT8)
        q8[name], q8[name + "_scale"] = q, scale
        ref[name] = q.float() * scale
    save_file(q8, int8 / "model.safetensors", metadata={"format": "pt"})
    save_file(ref, dequantized / "model.safetensors", metadata={"format": "pt"})
    return str(int8), str(dequantized)


@pytest.mark.parametrize("scheme", ["int8-dynamic", "int8-static"])
def test_int8_moe_experts(scheme, tmp_path):
    """A W8A8 checkpoint's int8 experts run as 8-bit weight-only experts (the fused MoE's
    8-bit kernels, tokens unquantized, as fp8 experts run): the tokens and logprobs of the
    same checkpoint with those experts dequantized in float32 and kept in the model's dtype
    by the ignore list (transformers cannot read back compressed-tensors' save of its fused
    experts here). A static scheme's expert input scales are dropped. At TP=2 each rank
    keeps its rows of gate and up and its columns of down."""
    path = str(tmp_path / "int8")
    write_fp8_checkpoint(make_tiny_model("qwen3_moe", str(tmp_path / "base")), path, scheme,
                         ["lm_head", "re:.*mlp.gate$"])
    int8, dequantized = _with_int8_experts(path, tmp_path)
    if scheme == "int8-static":
        _add_expert_input_scales(int8)
    _ignore_experts(dequantized)
    model = _load(int8, dtype="float32")
    moe = model.get_submodule("model.layers.0.mlp.experts")
    assert moe.w13.dtype == torch.int32 and moe.int4.bits == 8
    assert _load(dequantized, dtype="float32").get_submodule(
        "model.layers.0.mlp.experts").w13.dtype == torch.float32
    # at TP=2 the dense layers scale each rank's slice: both runs alike
    for tp in (1, 2) if scheme == "int8-dynamic" else (1,):
        _same(_generate(_llm(int8, tensor_parallel_size=tp)),
              _generate(_llm(dequantized, tensor_parallel_size=tp)))


def _ignore_experts(path: str) -> None:
    """The checkpoint's experts kept in the model's dtype by its ignore list."""
    config = json.loads((Path(path) / "config.json").read_text())
    config["quantization_config"]["ignore"].append("re:.*mlp.experts.*")
    (Path(path) / "config.json").write_text(json.dumps(config))


def _same(outs, want) -> None:
    """The reference run's tokens, and its first logprobs within 0.05 (a dense int8 layer's
    rows one rounding step apart, as in `_compare`; most agree to float32 rounding)."""
    for out, ref in zip(outs, want):
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
        ours, theirs = (torch.tensor([o.outputs[0].logprobs[0][t].logprob for t in range(256)])
                        for o in (out, ref))
        assert (ours - theirs).abs().max() < 0.05


def _add_expert_input_scales(path: str) -> None:
    from safetensors.torch import load_file, save_file
    tensors = load_file(Path(path) / "model.safetensors")
    for name in [n for n in tensors if ".mlp.experts." in n and n.endswith("_proj.weight")]:
        tensors[name.replace(".weight", ".input_scale")] = torch.tensor([0.02])
    save_file(tensors, Path(path) / "model.safetensors", metadata={"format": "pt"})


def test_experts_left_unquantized_are_refused(tmp_path):
    """compressed-tensors' own W8A8 of transformers' fused experts leaves them in float,
    unnamed by the ignore list: loom says it runs them in int8 or as the list keeps them."""
    path = str(tmp_path / "int8")
    write_fp8_checkpoint(make_tiny_model("qwen3_moe", str(tmp_path / "base")), path,
                         "int8-dynamic", ["lm_head", "re:.*mlp.gate$"])
    with pytest.raises(ValueError, match=r"MoE expert weight: torch.float32; loom runs the "
                                         r"experts of a W8A8-INT8 checkpoint in int8, or"):
        _load(path, dtype="float32")
