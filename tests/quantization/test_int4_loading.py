"""int4 checkpoints that loom refuses as they load, naming what is wrong; dummy weights
rounded to int4 as they are drawn; and the int4 op in a compiled model (the Triton kernel
in its interpreter on the CPU) against compressed-tensors' fake quantization."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from loom.config import EngineConfig, ModelConfig, ParallelConfig
from loom.distributed import parallel_state
from loom.layers.linear import ColumnParallelLinear, RowParallelLinear
from loom.quantization import int4
from loom.worker.model_loader import load_model
from tests.conftest import make_tiny_model

pytest.importorskip("compressed_tensors")

from tests.quantization.int4_checkpoints import (GROUP, as_gptq,  # noqa: E402
                                                 write_int4_checkpoint)

AWQ_CONFIG = {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
              "version": "gemm"}


def _load(path: str, **kwargs) -> torch.nn.Module:
    parallel = ParallelConfig(parallel_state.get_tp_group().world_size)
    model, _, _ = load_model(EngineConfig(ModelConfig(path, **kwargs), parallel=parallel),
                             torch.device("cpu"))
    return model


def _with_config(kind: str, path: Path, quantization_config: dict) -> str:
    """An unquantized tiny checkpoint whose config says it is int4 (dummy weights)."""
    make_tiny_model(kind, str(path))
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


@pytest.fixture(scope="module")
def gptq_base(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("sym"))
    write_int4_checkpoint(make_tiny_model("llama", str(tmp_path_factory.mktemp("b"))), path,
                          GROUP, True, ["lm_head"])
    return path


def test_act_order_g_idx_is_refused(gptq_base, tmp_path):
    """A checkpoint whose g_idx permutes the input features (act-order saved under a config
    that says desc_act false) is refused, not run with the wrong scales."""
    path = as_gptq(gptq_base, str(tmp_path / "gptq"), GROUP,
                   g_idx=lambda k: torch.arange(k).flip(0) // GROUP)
    with pytest.raises(ValueError, match=r"g_idx: input features are not in their plain "
                                         r"groups"):
        _load(path)


def _act_order(gptq_base, tmp_path, g_idx) -> str:
    return as_gptq(gptq_base, str(tmp_path / "gptq"), GROUP, g_idx=g_idx, desc_act=True)


def test_act_order_groups_must_be_whole(gptq_base, tmp_path):
    """g_idx naming groups of 31 and 33 features is no GPTQ act-order: refused, not run."""
    def uneven(k):
        g = torch.arange(k) // GROUP
        g[GROUP - 1] = 1
        return g
    with pytest.raises(ValueError, match=r"qkv_proj\.g_idx: its groups hold \[31, 33\] input "
                                         r"features; act-order groups must each hold 32"):
        _load(_act_order(gptq_base, tmp_path, uneven))


def test_stacked_act_orders_must_agree(gptq_base, tmp_path):
    """q, k and v share one input, so one order: a checkpoint giving k its own is refused."""
    from safetensors.torch import load_file, save_file
    path = Path(_act_order(gptq_base, tmp_path, lambda k: torch.randperm(k) // GROUP))
    tensors = load_file(path / "model.safetensors")
    name = "model.layers.0.self_attn.k_proj.g_idx"
    tensors[name] = tensors[name].flip(0).contiguous()
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match=r"g_idx: the stacked projections \(q/k/v or "
                                         r"gate/up\) of one layer have different act orders"):
        _load(str(path))


def test_act_order_in_row_parallel_layers_is_refused_at_tp_2(gptq_base, tmp_path,
                                                             monkeypatch):
    path = _act_order(gptq_base, tmp_path, None)
    monkeypatch.setitem(parallel_state._GROUPS, "tp",
                        parallel_state.GroupCoordinator("tp", 0, 2, None))
    with pytest.raises(ValueError, match=r"o_proj: act-order int4 \(desc_act, g_idx\) in a "
                                         r"row-parallel layer at tensor-parallel size 2"):
        _load(path)


def test_groups_a_rank_cannot_hold_whole_are_refused(tmp_path, monkeypatch):
    """At TP=2 o_proj's ranks hold 32 of its 64 input features: less than a group of 64."""
    monkeypatch.setitem(parallel_state._GROUPS, "tp",
                        parallel_state.GroupCoordinator("tp", 0, 2, None))
    path = _with_config("llama", tmp_path, dict(AWQ_CONFIG, group_size=64))
    with pytest.raises(ValueError, match=r"o_proj: 32 input features at tensor-parallel size 2 "
                                         r"are not a whole number of groups of 64"):
        _load(path, load_format="dummy")


@pytest.mark.parametrize("kind, error", [
    ("phi3", r"fused qkv_proj and gate_up_proj checkpoint tensors are not split in int4"),
])
def test_unsupported_models_are_refused(kind, error, tmp_path):
    with pytest.raises(ValueError, match=error):
        _load(_with_config(kind, tmp_path, AWQ_CONFIG), load_format="dummy")


def test_packed_words_must_be_int32(gptq_base, tmp_path):
    from safetensors.torch import load_file, save_file
    path = Path(as_gptq(gptq_base, str(tmp_path / "gptq"), GROUP))
    tensors = load_file(path / "model.safetensors")
    name = "model.layers.0.self_attn.o_proj.qweight"
    tensors[name] = tensors[name].to(torch.int64)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match=r"qweight: torch.int64, packed int4 words are int32"):
        _load(str(path))


def _close_to_drawn(w, drawn, scale, name) -> None:
    """Within half a step of the drawn weight (a little more at the top of an asymmetric
    group's range, its bfloat16 scale rounded down), and rounded, not kept."""
    step = scale.float().repeat_interleave(w.shape[-1] // scale.shape[-1], dim=-1)
    assert ((w - drawn.float()).abs() <= step * 0.6).all(), name
    assert (w - drawn.float()).abs().max() > 0, name


@pytest.mark.parametrize("kind, linear", [("llama", 8), ("qwen3_moe", 6)])
@pytest.mark.parametrize("zero_point", [True, False])
def test_dummy_weights_are_rounded_to_int4_per_group(kind, linear, zero_point, tmp_path):
    """Dummy weights are drawn as the unquantized model's are, then rounded to int4 per
    group: every linear layer and every expert."""
    from loom.layers.moe import FusedMoE
    path = _with_config(kind, tmp_path, dict(AWQ_CONFIG, zero_point=zero_point))
    plain = _load(path, load_format="dummy", quantization=None, dtype="bfloat16",
                  hf_overrides={"quantization_config": None})
    quantized = _load(path, load_format="dummy", dtype="bfloat16")
    layers = {n: m for n, m in quantized.named_modules()
              if isinstance(m, (ColumnParallelLinear, RowParallelLinear))}
    assert len(layers) == linear
    for name, layer in layers.items():
        packed, scale, zero = layer.quant.tensors(layer)
        assert layer.weight is None and packed.dtype == torch.int32
        assert (zero is not None) == zero_point
        _close_to_drawn(int4.dequantize(packed, scale, zero, GROUP),
                        plain.get_submodule(name).weight, scale, name)
    experts = [(n, m) for n, m in quantized.named_modules() if isinstance(m, FusedMoE)]
    assert len(experts) == (kind == "qwen3_moe")
    for name, layer in experts:
        for attr in ("w13", "w2"):
            packed, scale = getattr(layer, attr), getattr(layer, attr + "_scale")
            zero = getattr(layer, attr + "_zero", None)
            assert packed.dtype == torch.int32 and (zero is not None) == zero_point
            drawn = getattr(plain.get_submodule(name), attr)
            for e in range(packed.shape[0]):
                _close_to_drawn(int4.dequantize(packed[e], scale[e], None if zero is None
                                                else zero[e], GROUP), drawn[e], scale[e],
                                f"{name}.{attr}[{e}]")


def test_dummy_weights_in_8_bits(tmp_path):
    """GPTQ-Int8's config with dummy weights: four values a word, symmetric about 128."""
    path = _with_config("llama", tmp_path, {"quant_method": "gptq", "bits": 8,
                                            "group_size": GROUP, "desc_act": False})
    plain = _load(path, load_format="dummy", quantization=None, dtype="bfloat16",
                  hf_overrides={"quantization_config": None})
    quantized = _load(path, load_format="dummy", dtype="bfloat16")
    layer = quantized.get_submodule("model.layers.1.mlp.down_proj")
    packed, scale, zero = layer.quant.tensors(layer)
    assert zero is None and packed.shape == (64, 128 // 4)
    _close_to_drawn(int4.dequantize(packed, scale, None, GROUP, bits=8),
                    plain.get_submodule("model.layers.1.mlp.down_proj").weight, scale, "down")


def test_int4_op_in_a_compiled_model(tmp_path, monkeypatch):
    """Level 3 with `loom::int4_linear` in the graph, its Triton kernel run by the
    interpreter: the tokens compressed-tensors' fake quantization gives."""
    from loom import LLM, SamplingParams
    from tests.conftest import hf_greedy
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    from loom.kernels import int4_gemv, int4_linear
    from loom.kernels.interpreter import interpreted
    if not interpreted(int4_linear._int4_kernel):
        pytest.skip("Triton's interpreter was not on when the kernel module loaded")
    calls, gemv_calls = [], []
    real, real_gemv = int4_linear.int4_matmul, int4_gemv.int4_gemv
    monkeypatch.setattr(int4_linear, "int4_matmul",
                        lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    monkeypatch.setattr(int4_gemv, "int4_gemv", lambda *a, **k: gemv_calls.append(
        a[0].shape[0]) or real_gemv(*a, **k))
    monkeypatch.setattr(int4.Int4Linear, "use_op", staticmethod(lambda x: True))
    reference = write_int4_checkpoint(make_tiny_model("qwen3", str(tmp_path / "b")),
                                      str(tmp_path / "q"), GROUP, False, ["lm_head"])
    llm = LLM(str(tmp_path / "q"), skip_tokenizer_init=True, dtype="float32", device="cpu",
              max_model_len=64, compilation_config=3)
    prompts = [[1, 5, 9, 33, 7, 100, 200, 3], [4, 44, 144], [8, 80, 11, 2]]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert not gemv_calls  # three requests' decode rows, and prompt rows: the tile
        pair = llm.generate(prompts[:2], params, use_tqdm=False)  # two rows: the GEMV
    finally:
        llm.shutdown()
    for prompt, out in zip(prompts + prompts[:2], outs + pair):
        assert out.outputs[0].token_ids == hf_greedy(reference, prompt, 4)
    assert calls and min(calls) == 3 < max(calls) and set(gemv_calls) == {2}


def test_loaded_int4_experts_run_in_the_fused_moe_kernels(tmp_path, monkeypatch):
    """A loaded int4 MoE layer's tensors, as FusedMoE hands them to `loom::fused_moe`
    (Triton's interpreter here), give the CPU reference's output: the loader's layout is the
    kernels'."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    from loom.kernels import fused_moe, moe_gemm
    from loom.kernels.interpreter import interpreted, patch_interpreter
    from loom.layers.moe import FusedMoE, experts_reference
    if not interpreted(moe_gemm._down_kernel):
        pytest.skip("Triton's interpreter was not on when the kernel module loaded")
    patch_interpreter()
    from tests.quantization.int4_checkpoints import write_int4_moe_checkpoint
    write_int4_moe_checkpoint(make_tiny_model("qwen3_moe", str(tmp_path / "b")),
                              str(tmp_path / "q"), 16, False)
    model = _load(str(tmp_path / "q"))
    layer = next(m for m in model.modules() if isinstance(m, FusedMoE))
    gen = torch.Generator().manual_seed(0)
    for tokens in (3, 24):  # the GEMV and the grouped GEMM
        x = torch.randn(tokens, layer.hidden_size, generator=gen)
        weights, ids = torch.softmax(torch.randn(tokens, layer.num_experts, generator=gen),
                                     dim=-1).topk(layer.top_k, dim=-1)
        want = experts_reference(x, layer.w13, layer.w2, weights, ids, **layer.quant_args())
        got = fused_moe.fused_moe(x, layer.w13, layer.w2, weights, ids, **layer.quant_args())
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
