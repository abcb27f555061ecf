"""Block-wise fp8 checkpoints (llm-compressor's FP8_BLOCK; the `fp8` method's
weight_block_size with `weight_scale_inv`, as Qwen3's FP8 releases) against
compressed-tensors' fake quantization as transformers runs the checkpoint: greedy tokens
equal, logprobs within float32 rounding, on the CPU. The tiny models are 64 features wide,
so their blocks are 32 x 32 (16 x 32 at TP=2, where each rank holds 16 rows of a KV head)
rather than the releases' 128 x 128: loom takes the size from the config."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from loom.distributed.parallel_state import GroupCoordinator
from loom.quantization.config import Fp8Scheme
from tests.conftest import make_tiny_model

pytest.importorskip("compressed_tensors")

from tests.quantization.fp8_checkpoints import (as_fp8_method, load_reference,  # noqa: E402
                                                write_block_fp8, write_fp8_checkpoint)
from tests.quantization.test_fp8 import PROMPTS, _check_against, _llm  # noqa: E402


@pytest.fixture(scope="module")
def block_checkpoint(tmp_path_factory):
    """(FP8_BLOCK checkpoint of the tiny Qwen3 in 32 x 32 blocks, transformers' reading of
    it, the unquantized model and its path)."""
    base = str(tmp_path_factory.mktemp("qwen3-base"))
    path = str(tmp_path_factory.mktemp("qwen3-fp8-block"))
    write_fp8_checkpoint(make_tiny_model("qwen3", base), path, "fp8-block", ["lm_head"],
                         block=[32, 32])
    return path, load_reference(path), make_tiny_model("qwen3", base), base


@pytest.mark.parametrize("fmt", ["compressed-tensors", "fp8"])
def test_block_checkpoint_matches_compressed_tensors(fmt, block_checkpoint, tmp_path):
    """fp8: the same tensors as Qwen3-8B-FP8 lays them out (weight_scale_inv, float32)."""
    path, reference, unquantized, _ = block_checkpoint
    if fmt == "fp8":
        path = as_fp8_method(path, str(tmp_path / "fp8"))
    _check_against(_llm(path), reference, unquantized)


def test_tensor_parallel(tmp_path):
    """TP=2 on gloo equals the TP=1 reference: each row-parallel rank's input features are
    whole activation groups, so splitting them changes no scale. One KV head, so both
    ranks hold it (its block scales too), beside their own query heads' blocks."""
    base, ct = str(tmp_path / "base"), str(tmp_path / "ct")
    write_fp8_checkpoint(make_tiny_model("llama_mqa", base), ct, "fp8-block", ["lm_head"],
                         block=[16, 32])
    path = as_fp8_method(ct, str(tmp_path / "fp8"))
    _check_against(_llm(path, tensor_parallel_size=2), load_reference(ct),
                   make_tiny_model("llama_mqa", base))


def test_dummy_weights_quantize_block_wise(block_checkpoint):
    """--load-format dummy draws the weights in the model's dtype; they are quantized into
    the checkpoint's blocks, so the layers run as they would with its tensors."""
    from loom import SamplingParams
    llm = _llm(block_checkpoint[0], load_format="dummy")
    try:
        out = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=2, ignore_eos=True),
                           use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 2
    finally:
        llm.shutdown()


def test_misaligned_blocks_are_refused(block_checkpoint, tmp_path):
    """64-row blocks: k_proj's 32 rows share a block row in the stacked qkv_proj with
    v_proj's, whose scale differs; refused at load, naming the layer and the shard."""
    path = write_block_fp8(block_checkpoint[3], str(tmp_path / "b64"), [64, 32])
    with pytest.raises(ValueError, match=r"layers\.0\.self_attn\.qkv_proj shard 'k': its 32 "
                                         r"output rows at row 64 .* not whole 64-row"):
        _llm(path)


def _layers(monkeypatch, rank: int, block: tuple[int, int], kv_heads: int):
    """A qkv, a gate/up and a down projection as TP rank `rank` of 2 builds them, made
    block-wise fp8 (no process group: the layers only read their rank)."""
    from loom.layers import linear
    from loom.quantization.fp8 import quantize_model
    monkeypatch.setattr(linear, "get_tp_group", lambda: GroupCoordinator("tp", rank, 2, None))
    model = nn.ModuleDict({
        "qkv_proj": linear.QKVParallelLinear(64, 16, 4, kv_heads),
        "gate_up_proj": linear.MergedColumnParallelLinear(64, [128, 128]),
        "down_proj": linear.RowParallelLinear(128, 64)})
    quantize_model(model, Fp8Scheme("fp8", True, "group", weight_block=block), True)
    return model


@pytest.mark.parametrize("rank", [0, 1])
def test_scales_shard_with_their_blocks(rank, monkeypatch):
    """Each rank's scale rows are its weight rows' blocks, at their offsets in the stacked
    layers; a replicated KV head's scales go to both ranks; a row-parallel rank takes the
    scale columns of its input features."""
    m = _layers(monkeypatch, rank, (16, 32), kv_heads=1)
    full = {s: torch.randn(n, 2) for s, n in (("q", 4), ("k", 1), ("v", 1))}
    qkv = m["qkv_proj"].weight_scale
    for shard, scale in full.items():
        qkv.weight_loader(qkv, scale, shard)
    torch.testing.assert_close(qkv, torch.cat([full["q"][2 * rank:2 * rank + 2], full["k"],
                                               full["v"]]), rtol=0, atol=0)
    gate, up = torch.randn(8, 2), torch.randn(8, 2)
    gu = m["gate_up_proj"].weight_scale
    gu.weight_loader(gu, gate, 0)
    gu.weight_loader(gu, up, 1)
    torch.testing.assert_close(gu, torch.cat([gate[4 * rank:4 * rank + 4],
                                              up[4 * rank:4 * rank + 4]]), rtol=0, atol=0)
    down = torch.randn(4, 4)
    ds = m["down_proj"].weight_scale
    ds.weight_loader(ds, down)
    torch.testing.assert_close(ds, down[:, 2 * rank:2 * rank + 2], rtol=0, atol=0)


def test_ranks_that_split_a_block_are_refused(monkeypatch):
    m = _layers(monkeypatch, 1, (32, 32), kv_heads=2)  # each rank: 16 rows of k
    qkv = m["qkv_proj"].weight_scale
    with pytest.raises(ValueError, match=r"qkv_proj shard 'k': its 16 output rows at row 32 "
                                         r"of this rank's 64 \(2 slice"):
        qkv.weight_loader(qkv, torch.randn(1, 2), "k")
    with pytest.raises(ValueError, match=r"down_proj: each of 2 tensor-parallel ranks would "
                                         r"hold 64 input features, not a whole number of the "
                                         r"checkpoint's 128-column"):
        _layers(monkeypatch, 0, (32, 128), kv_heads=2)
