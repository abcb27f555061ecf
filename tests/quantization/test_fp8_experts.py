"""fp8 MoE experts in a checkpoint (Qwen3's MoE FP8 releases: block-wise with
`weight_scale_inv`; llm-compressor's FP8_DYNAMIC: per channel with `weight_scale`): loom
keeps experts in the model's dtype, so they are dequantized as they load. The reference is
the same checkpoint with each expert tensor replaced by its fp8 values times its scale,
computed here in float32: loom must generate the very same tokens and logprobs from both.
An fp8 tensor without its scale is refused by name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from loom import SamplingParams
from loom.quantization.dequant import Fp8Dequantizer
from tests.conftest import make_tiny_model

pytest.importorskip("compressed_tensors")

from tests.quantization.fp8_checkpoints import write_block_fp8  # noqa: E402
from tests.quantization.test_fp8 import PROMPTS, _llm, checkpoints  # noqa: E402,F401

EXPERT = ".mlp.experts."
FP8 = torch.float8_e4m3fn


def _per_row(w):
    scale = w.abs().amax(dim=1, keepdim=True).float() / 448
    return (w.float() / scale).to(FP8), scale


def _per_block(w, block=(32, 32)):
    rows, cols = w.shape
    br, bc = -(-rows // block[0]), -(-cols // block[1])
    padded = torch.zeros(br * block[0], bc * block[1])
    padded[:rows, :cols] = w.float()
    tiles = padded.view(br, block[0], bc, block[1])
    scale = tiles.abs().amax(dim=(1, 3)) / 448
    q = (tiles / scale[:, None, :, None]).view_as(padded)[:rows, :cols].to(FP8)
    return q, scale


def _expand(q, scale):
    """q's values times their scale, in float32: the reference's expert weights."""
    rows, cols = q.shape
    if scale.shape == (rows, 1):
        return q.float() * scale
    full = scale.repeat_interleave(32, 0)[:rows].repeat_interleave(32, 1)[:, :cols]
    return q.float() * full


def _with_fp8_experts(path: str, dest: Path, suffix: str, quantize) -> tuple[str, str]:
    """(path with every expert weight fp8 and its scale beside it, path with the same
    experts dequantized in float32)."""
    from safetensors.torch import load_file, save_file
    quantized, dequantized = dest / "fp8-experts", dest / "dequantized"
    for out in (quantized, dequantized):
        shutil.copytree(path, out)
    tensors = load_file(Path(path) / "model.safetensors")
    fp8, ref = dict(tensors), dict(tensors)
    experts = [n for n in tensors if EXPERT in n and n.endswith("_proj.weight")]
    assert experts
    for name in experts:
        q, scale = quantize(tensors[name])
        fp8[name], fp8[name + suffix] = q, scale
        ref[name] = _expand(q, scale)
    save_file(fp8, quantized / "model.safetensors", metadata={"format": "pt"})
    save_file(ref, dequantized / "model.safetensors", metadata={"format": "pt"})
    return str(quantized), str(dequantized)


def _generate(path: str):
    llm = _llm(path)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=5)
        return [(o.outputs[0].token_ids, [{t: lp.logprob for t, lp in step.items()}
                                          for step in o.outputs[0].logprobs])
                for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    finally:
        llm.shutdown()


@pytest.mark.parametrize("layout", ["block", "channel"])
def test_fp8_experts_load_dequantized(layout, checkpoints, tmp_path):
    """block: Qwen3-30B-A3B-FP8's layout (the `fp8` method, weight_block_size, every
    linear layer and expert block-wise); channel: a compressed-tensors FP8_DYNAMIC
    checkpoint whose experts carry a weight_scale per row."""
    if layout == "block":
        base = str(tmp_path / "base")
        make_tiny_model("qwen3_moe", base)
        path = write_block_fp8(base, str(tmp_path / "block"), [32, 32])
        quantized, reference = _with_fp8_experts(path, tmp_path, "_scale_inv", _per_block)
    else:
        path, *_ = checkpoints("qwen3_moe-dynamic")
        quantized, reference = _with_fp8_experts(path, tmp_path, "_scale", _per_row)
    got, want = _generate(quantized), _generate(reference)
    assert got == want
    # and the experts are not the unquantized model's: fp8 moved them
    assert _generate(path) != got


def test_fp8_router_without_a_scale_is_refused(checkpoints, tmp_path):
    """An fp8 tensor for a parameter loom keeps in the model's dtype, with no scale beside
    it: an error naming it at the end of the load, never a silent cast."""
    from safetensors.torch import load_file, save_file
    path, *_ = checkpoints("qwen3_moe-dynamic")
    changed = tmp_path / "fp8-router"
    shutil.copytree(path, changed)
    tensors = load_file(changed / "model.safetensors")
    name = "model.layers.0.mlp.gate.weight"
    tensors[name] = tensors[name].to(FP8)
    save_file(tensors, changed / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"{name}: an fp8 weight .* needs its scale"):
        _llm(str(changed))


def test_dequantizer_pairs_either_order_and_checks_shapes():
    w = torch.randn(64, 96)
    q, scale = _per_block(w)
    first = Fp8Dequantizer((32, 32))
    assert first.add_scale("e.weight_scale_inv", scale) is None  # the scale first
    name, got = first.weight("e.weight", q), None
    assert torch.equal(name, _expand(q, scale))
    first.check_done()
    second = Fp8Dequantizer(None)  # block size from the shapes
    assert second.weight("e.weight", q) is None
    got = second.add_scale("e.weight_scale_inv", scale)
    assert got[0] == "e.weight" and torch.equal(got[1], _expand(q, scale))
    assert second.add_scale("e.input_scale", torch.ones(1)) is None  # dropped
    second.check_done()
    per_tensor = Fp8Dequantizer(None)
    per_tensor.weight("t.weight", q)
    assert torch.equal(per_tensor.add_scale("t.weight_scale", torch.tensor(0.5))[1],
                       q.float() * 0.5)
    bad = Fp8Dequantizer((32, 32))
    bad.weight("b.weight", q)
    with pytest.raises(ValueError, match="does not tile"):
        bad.add_scale("b.weight_scale_inv", torch.ones(3, 3))
    lonely = Fp8Dequantizer(None)
    lonely.add_scale("l.weight_scale", torch.ones(64, 1))
    with pytest.raises(ValueError, match="l.weight_scale"):
        lonely.check_done()
