"""fp8 MoE experts in a checkpoint (Qwen3's MoE FP8 releases: block-wise with
`weight_scale_inv`; llm-compressor's FP8_DYNAMIC: per channel with `weight_scale`) load as
they are: each FusedMoE's w13 and w2 in float8_e4m3fn with their scales, sliced per
tensor-parallel rank, for the fused MoE's W8A16 kernels (the CPU reference dequantizes the
experts it uses). The reference is the same checkpoint with each expert tensor replaced by
its fp8 values times its scale, computed here in float32: loom must generate the very same
tokens and logprobs from both. An fp8 tensor without its scale, a scale that fits no
layout and blocks a rank cannot hold whole are refused by name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from loom import SamplingParams
from loom.config import EngineConfig, ModelConfig, ParallelConfig
from loom.distributed import parallel_state
from loom.quantization.dequant import Fp8Dequantizer
from loom.worker.model_loader import load_model
from tests.conftest import make_tiny_model

pytest.importorskip("compressed_tensors")

from tests.quantization.fp8_checkpoints import write_block_fp8  # noqa: E402
from tests.quantization.test_fp8 import PROMPTS, _llm, checkpoints  # noqa: E402,F401

EXPERT = ".mlp.experts."
LAYER = "model.layers.0.mlp.experts"
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


def _expand(q, scale, block=(32, 32)):
    """q's values times their scale, in float32: the reference's expert weights."""
    rows, cols = q.shape
    if scale.shape == (rows, 1):
        return q.float() * scale
    full = scale.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    return q.float() * full


def _with_fp8_experts(path: str, dest: Path, suffix: str, quantize,
                      block=(32, 32)) -> tuple[str, str]:
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
        ref[name] = _expand(q, scale, block)
    save_file(fp8, quantized / "model.safetensors", metadata={"format": "pt"})
    save_file(ref, dequantized / "model.safetensors", metadata={"format": "pt"})
    return str(quantized), str(dequantized)


def _generate(path: str, **kwargs):
    llm = _llm(path, **kwargs)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=5)
        return [(o.outputs[0].token_ids, [{t: lp.logprob for t, lp in step.items()}
                                          for step in o.outputs[0].logprobs])
                for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    finally:
        llm.shutdown()


def _load(path: str, tp_rank: int | None = None) -> torch.nn.Module:
    """load_model on the CPU in float32; tp_rank: as that rank of TP=2 (loading only reads
    the rank, so no process group is needed)."""
    with pytest.MonkeyPatch.context() as m:
        if tp_rank is not None:
            m.setitem(parallel_state._GROUPS, "tp",
                      parallel_state.GroupCoordinator("tp", tp_rank, 2, None))
        parallel = ParallelConfig(parallel_state.get_tp_group().world_size)
        model, _, _ = load_model(EngineConfig(ModelConfig(path, dtype="float32"),
                                              parallel=parallel), torch.device("cpu"))
    return model


@pytest.fixture(scope="module")
def fp8_checkpoints(checkpoints, tmp_path_factory):
    """layout -> (fp8 experts' checkpoint, its experts dequantized, the unquantized one).
    block: Qwen3-30B-A3B-FP8's layout (the `fp8` method, weight_block_size, every linear
    layer and expert block-wise, 32 x 32 here; "block16": 16 x 16, whole blocks at TP=2);
    channel: a compressed-tensors FP8_DYNAMIC checkpoint whose experts carry a weight_scale
    per row."""
    cache = {}

    def get(layout: str):
        if layout not in cache:
            tmp = tmp_path_factory.mktemp(layout)
            if layout == "channel":
                path, *_ = checkpoints("qwen3_moe-dynamic")
                cache[layout] = (*_with_fp8_experts(path, tmp, "_scale", _per_row), path)
            else:
                block = (16, 16) if layout == "block16" else (32, 32)
                base = str(tmp / "base")
                make_tiny_model("qwen3_moe", base)
                path = write_block_fp8(base, str(tmp / "block"), list(block))
                cache[layout] = (*_with_fp8_experts(path, tmp, "_scale_inv",
                                                    lambda w: _per_block(w, block), block),
                                 path)
        return cache[layout]
    return get


@pytest.mark.parametrize("layout", ["block", "channel"])
def test_fp8_experts_generate_as_dequantized(layout, fp8_checkpoints):
    quantized, reference, unquantized = fp8_checkpoints(layout)
    got, want = _generate(quantized), _generate(reference)
    assert got == want
    # and the experts are not the unquantized model's: fp8 moved them
    assert _generate(unquantized) != got


def test_quantizing_at_load_keeps_experts_fp8(checkpoints, tmp_path):
    """--quantization fp8 on an unquantized MoE checkpoint, compiled at level 3, generates
    what loom generates from its FP8_DYNAMIC checkpoint (the linear layers alike) with
    every expert quantized per row here and stored dequantized: its experts are fp8 with
    a scale per row, and the CPU path runs them as the dequantized ones."""
    path, _, base, _ = checkpoints("qwen3_moe-dynamic")
    _, reference = _with_fp8_experts(path, tmp_path, "_scale", _per_row)
    got = _generate(base, quantization="fp8", compilation_config=3)
    assert got == _generate(reference, compilation_config=3)


@pytest.mark.parametrize("layout", ["block", "channel"])
def test_fp8_experts_load_as_the_checkpoint_has_them(layout, fp8_checkpoints):
    """w13 stacks each expert's gate and up rows, w2 its down; their scales beside them in
    the same order (block scales: gate's block rows, then up's)."""
    from safetensors.torch import load_file
    quantized, _, _ = fp8_checkpoints(layout)
    tensors = load_file(Path(quantized) / "model.safetensors")
    layer = _load(quantized).get_submodule(LAYER)
    assert layer.w13.dtype == layer.w2.dtype == FP8
    assert layer.weight_block == (None if layout == "channel" else (32, 32))
    suffix = "_scale" if layout == "channel" else "_scale_inv"
    for e in range(layer.w13.shape[0]):
        ckpt = {p: f"{LAYER}.{e}.{p}_proj.weight" for p in ("gate", "up", "down")}
        w13 = torch.cat([tensors[ckpt["gate"]], tensors[ckpt["up"]]])
        s13 = torch.cat([tensors[ckpt["gate"] + suffix], tensors[ckpt["up"] + suffix]])
        assert torch.equal(layer.w13[e].view(torch.uint8), w13.view(torch.uint8))
        assert torch.equal(layer.w2[e].view(torch.uint8), tensors[ckpt["down"]].view(torch.uint8))
        assert torch.equal(layer.w13_scale[e], s13.float().reshape(layer.w13_scale[e].shape))
        down_scale = tensors[ckpt["down"] + suffix].float()
        assert torch.equal(layer.w2_scale[e], down_scale.reshape(layer.w2_scale[e].shape))


@pytest.mark.parametrize("layout", ["block16", "channel"])
def test_tensor_parallel_ranks_hold_their_slices(layout, fp8_checkpoints):
    """At TP=2 each rank's experts are its slices of TP=1's: rows of gate and up (and of
    their scales), columns of down (and of its block scales; per-row scales whole)."""
    quantized, _, _ = fp8_checkpoints(layout)
    whole = _load(quantized).get_submodule(LAYER)
    inter = whole.w2.shape[2]
    half, block = inter // 2, whole.weight_block
    for rank in (0, 1):
        part = _load(quantized, tp_rank=rank).get_submodule(LAYER)
        rows = list(range(rank * half, (rank + 1) * half))
        rows += [inter + r for r in rows]
        assert torch.equal(part.w13.view(torch.uint8), whole.w13[:, rows].view(torch.uint8))
        cols = slice(rank * half, (rank + 1) * half)
        assert torch.equal(part.w2.view(torch.uint8), whole.w2[:, :, cols].view(torch.uint8))
        if block is None:
            assert torch.equal(part.w13_scale, whole.w13_scale[:, rows])
            assert torch.equal(part.w2_scale, whole.w2_scale)
        else:  # 16-row blocks: gate's and up's halves are whole blocks
            block_rows = [r // block[0] for r in rows[::block[0]]]
            assert torch.equal(part.w13_scale, whole.w13_scale[:, block_rows])
            assert torch.equal(part.w2_scale,
                               whole.w2_scale[:, :, rank * half // block[1]:
                                              (rank + 1) * half // block[1]])


def test_block_scales_a_rank_cannot_hold_whole_are_refused(fp8_checkpoints):
    """32 x 32 blocks over 32 intermediate rows: at TP=2 each rank would hold half of a
    block of down's columns (down loads first: its name sorts before gate's)."""
    quantized, _, _ = fp8_checkpoints("block")
    with pytest.raises(ValueError, match=rf"{LAYER}\.0\.down_proj\.weight: each of 2 "
                                         r"tensor-parallel ranks would hold 16 of its columns"):
        _load(quantized, tp_rank=1)


def _edited(path: str, dest: Path, edit) -> str:
    from safetensors.torch import load_file, save_file
    shutil.copytree(path, dest)
    tensors = load_file(dest / "model.safetensors")
    edit(tensors)
    save_file(tensors, dest / "model.safetensors", metadata={"format": "pt"})
    return str(dest)


def test_an_expert_scale_of_no_layout_is_refused_by_name(fp8_checkpoints, tmp_path):
    quantized, _, _ = fp8_checkpoints("channel")
    name = f"{LAYER}.3.up_proj.weight"

    def edit(tensors):
        tensors[name + "_scale"] = torch.ones(16, 2)
    with pytest.raises(ValueError, match=rf"{name}: its scale of shape \(16, 2\) fits no "
                                         r"fp8 layout .* a scale per channel \(32,\)"):
        _load(_edited(quantized, tmp_path / "bad", edit))


def test_a_layer_of_fp8_and_unquantized_experts_is_refused(fp8_checkpoints, tmp_path):
    quantized, reference, _ = fp8_checkpoints("channel")
    from safetensors.torch import load_file
    plain = load_file(Path(reference) / "model.safetensors")
    name = f"{LAYER}.5.gate_proj.weight"

    def edit(tensors):
        tensors[name] = plain[name]
        del tensors[name + "_scale"]
    with pytest.raises(ValueError, match=rf"{LAYER}\.w13: expert 5's gate weight arrived "
                                         r"as torch.float32 where this layer's other "
                                         r"experts arrived in fp8"):
        _load(_edited(quantized, tmp_path / "mixed", edit))


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
    pair = first.weight("e.weight", q)
    assert pair.name == "e.weight" and pair.values is q and pair.scale is scale
    assert torch.equal(first.dequantize(pair), _expand(q, scale))
    first.check_done()
    second = Fp8Dequantizer(None)  # block size from the shapes
    assert second.weight("e.weight", q) is None
    pair = second.add_scale("e.weight_scale_inv", scale)
    assert pair.name == "e.weight" and torch.equal(second.dequantize(pair), _expand(q, scale))
    assert second.add_scale("e.input_scale", torch.ones(1)) is None  # dropped
    second.check_done()
    per_tensor = Fp8Dequantizer(None)
    per_tensor.weight("t.weight", q)
    pair = per_tensor.add_scale("t.weight_scale", torch.tensor(0.5))
    assert torch.equal(per_tensor.dequantize(pair), q.float() * 0.5)
    bad = Fp8Dequantizer((32, 32))
    bad.weight("b.weight", q)
    with pytest.raises(ValueError, match="does not tile"):
        bad.dequantize(bad.add_scale("b.weight_scale_inv", torch.ones(3, 3)))
    lonely = Fp8Dequantizer(None)
    lonely.add_scale("l.weight_scale", torch.ones(64, 1))
    with pytest.raises(ValueError, match="l.weight_scale"):
        lonely.check_done()
