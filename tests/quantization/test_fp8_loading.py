"""fp8 models are built and loaded without a model-dtype copy of their linear weights: the
layers are built on the meta device, an fp8 checkpoint's tensors go straight into fp8
parameters, and a layer quantized at load (`--quantization fp8`, dummy weights) is staged
in the model's dtype only until all its rows have arrived. The weights are byte for byte
what quantizing the unquantized model's layers gives (the old path: load it all in the
model's dtype, then quantize each layer), and the peak of model-dtype linear weights alive
during `load_model` is one layer's."""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from loom.config import EngineConfig, ModelConfig, ParallelConfig
from loom.distributed import parallel_state
from loom.layers.linear import ColumnParallelLinear, RowParallelLinear
from loom.layers.moe import FusedMoE
from loom.quantization.fp8 import quantize_rows
from loom.quantization.fp8_block import quantize_blocks
from loom.worker.model_loader import load_model
from tests.conftest import TINY

FP8 = torch.float8_e4m3fn


def _load(path: str, **kwargs) -> torch.nn.Module:
    parallel = ParallelConfig(parallel_state.get_tp_group().world_size)
    model, _, _ = load_model(EngineConfig(ModelConfig(path, **kwargs), parallel=parallel),
                             torch.device("cpu"))
    return model


def _linear_layers(model) -> dict[str, torch.nn.Module]:
    return {n: m for n, m in model.named_modules()
            if isinstance(m, (ColumnParallelLinear, RowParallelLinear))}


def _quantized_plain(plain, block=None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each linear layer of the unquantized model quantized as a whole (the old path), and
    each expert's stacked w13 and w2 likewise, expert by expert (keyed by the parameter)."""
    def quantize(w):
        return quantize_rows(w) if block is None else quantize_blocks(w, block)
    out = {n: quantize(m.weight.data) for n, m in _linear_layers(plain).items()}
    for name, layer in plain.named_modules():
        if isinstance(layer, FusedMoE):
            for attr in ("w13", "w2"):
                pairs = [quantize(w) for w in getattr(layer, attr).data]
                out[f"{name}.{attr}"] = tuple(torch.stack(t) for t in zip(*pairs))
    return out


_SCALES = (".weight_scale", ".w13_scale", ".w2_scale")


def _fp8_of(model, name) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 values, scale) of a linear layer or of an expert weight (named by parameter)."""
    if name.endswith((".w13", ".w2")):
        return model.get_parameter(name), model.get_parameter(name + "_scale")
    layer = model.get_submodule(name)
    return layer.weight, layer.weight_scale


def _assert_matches(model, plain, expected, dtype: torch.dtype = FP8) -> None:
    """model's fp8 (or int8: dtype) layers and experts hold `expected`'s bytes and scales;
    its other parameters equal the unquantized model's, in the same order (dummy weights'
    seeds follow it)."""
    names = [n for n, _ in model.named_parameters()]
    assert [n for n in names if not n.endswith(_SCALES)] == \
        [n for n, _ in plain.named_parameters()]
    for name, (q, scale) in expected.items():
        weight, weight_scale = _fp8_of(model, name)
        assert weight.dtype == dtype and weight.shape == q.shape, name
        assert torch.equal(weight.view(torch.uint8), q.view(torch.uint8)), name
        assert torch.equal(weight_scale, scale), name
    params = dict(model.named_parameters())
    for name, param in plain.named_parameters():
        if name not in expected and name.rsplit(".", 1)[0] not in expected:
            assert params[name].dtype == param.dtype and torch.equal(params[name], param), name


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe", "phi3"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_quantized_at_load_as_a_whole_model_would_be(kind, dtype, tiny_model_factory):
    """qwen3_moe: experts quantized per row like the linear layers, routers in the model's
    dtype; phi3: its fused qkv and
    gate_up tensors are split on load and arrive as shards."""
    path, _ = tiny_model_factory(kind)
    plain = _load(path, dtype=dtype)
    _assert_matches(_load(path, dtype=dtype, quantization="fp8"), plain, _quantized_plain(plain))


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_dummy_weights_are_drawn_and_quantized_as_before(kind, tiny_model_factory):
    """Each fp8 layer's values are drawn in the model's dtype from the generator its weight
    had (seeded by its index among the parameters), then quantized."""
    path, _ = tiny_model_factory(kind)
    plain = _load(path, dtype="bfloat16", load_format="dummy", seed=7)
    fp8 = _load(path, dtype="bfloat16", load_format="dummy", seed=7, quantization="fp8")
    _assert_matches(fp8, plain, _quantized_plain(plain))


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_moe"])
def test_block_wise_dummy_weights(kind, tiny_model_factory, tmp_path):
    """Dummy weights for a block-wise checkpoint's config: quantized in its blocks (each
    expert's stacked gate and up as one weight)."""
    path, _ = tiny_model_factory(kind)
    config = json.loads((Path(path) / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "weight_block_size": [32, 32]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    plain = _load(path, dtype="bfloat16", load_format="dummy")
    fp8 = _load(str(tmp_path), dtype="bfloat16", load_format="dummy")
    _assert_matches(fp8, plain, _quantized_plain(plain, (32, 32)))


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("kind", ["llama", "llama_mqa", "qwen3_moe"])
def test_tensor_parallel_ranks(kind, rank, tiny_model_factory, monkeypatch):
    """TP=2 (no process group: loading only reads the rank): each rank quantizes its own
    shards, as it did once they had loaded in full; llama_mqa replicates its KV head;
    qwen3_moe's experts: each rank's rows of gate and up, its columns of down."""
    monkeypatch.setitem(parallel_state._GROUPS, "tp",
                        parallel_state.GroupCoordinator("tp", rank, 2, None))
    path, _ = tiny_model_factory(kind)
    plain = _load(path, dtype="bfloat16")
    _assert_matches(_load(path, dtype="bfloat16", quantization="fp8"), plain,
                    _quantized_plain(plain))
    plain = _load(path, dtype="bfloat16", load_format="dummy")
    _assert_matches(_load(path, dtype="bfloat16", load_format="dummy", quantization="fp8"),
                    plain, _quantized_plain(plain))


_STACKS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@pytest.mark.parametrize("scheme", ["fp8-dynamic", "fp8-static"])
def test_checkpoint_tensors_load_as_they_are(scheme, tmp_path):
    """An fp8 checkpoint's weights and scales land in the fp8 parameters unchanged (a
    per-tensor scale spread over its rows; stacked layers take the largest input scale);
    the layer it leaves unquantized loads in the model's dtype."""
    pytest.importorskip("compressed_tensors")
    from safetensors.torch import load_file

    from tests.conftest import make_tiny_model
    from tests.quantization.fp8_checkpoints import write_fp8_checkpoint
    path = str(tmp_path / "fp8")
    write_fp8_checkpoint(make_tiny_model("llama", str(tmp_path / "base")), path, scheme,
                         ["lm_head", "re:.*layers.1.mlp.down_proj"])
    tensors = load_file(Path(path) / "model.safetensors")
    model = _load(path, dtype="bfloat16")
    for name, layer in _linear_layers(model).items():
        parent, own = name.rsplit(".", 1)
        parts = [f"{parent}.{p}" for p in _STACKS.get(own, (own,))]
        if name == "model.layers.1.mlp.down_proj":
            assert torch.equal(layer.weight, tensors[f"{name}.weight"].to(torch.bfloat16))
            continue
        weights = [tensors[f"{p}.weight"] for p in parts]
        assert torch.equal(layer.weight.view(torch.uint8), torch.cat(weights).view(torch.uint8))
        scales = [tensors[f"{p}.weight_scale"].float().reshape(-1, 1).expand(len(w), 1)
                  for p, w in zip(parts, weights)]
        assert torch.equal(layer.weight_scale, torch.cat(scales)), name
        if scheme == "fp8-static":
            expected = torch.stack([tensors[f"{p}.input_scale"].float().reshape(())
                                    for p in parts]).amax().reshape(1)
            assert torch.equal(layer.input_scale, expected), name


def test_a_layer_with_rows_missing_is_an_error(tiny_model_factory, tmp_path):
    """A stacked layer whose checkpoint lacks one of its tensors cannot be quantized: an
    error naming it and the rows that never arrived (they were left unset before)."""
    from safetensors.torch import load_file, save_file
    path, _ = tiny_model_factory("llama")
    shutil.copytree(path, tmp_path, dirs_exist_ok=True)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.0.self_attn.v_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"layers\.0\.self_attn\.qkv_proj\.weight: the "
                                         r"checkpoint filled 96 of this rank's 128 output "
                                         r"rows \(rows 96-127 missing\)"):
        _load(str(tmp_path), quantization="fp8")


class _LiveLinearWeights(TorchDispatchMode):
    """The peak bytes of live tensors in `dtype` shaped like a linear layer's weight,
    counted (once per storage) whenever a 2-D tensor in `dtype` is allocated or written,
    leaving out what a copy reads from (a checkpoint tensor being loaded)."""

    def __init__(self, dtype: torch.dtype, shapes: set[tuple[int, int]]) -> None:
        super().__init__()
        self.dtype, self.shapes, self.peak = dtype, shapes, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        aten = torch.ops.aten
        if func in (aten.empty.memory_format, aten.empty_strided.default):
            target, source = out, None
        elif func in (aten.copy_.default, aten.uniform_.default):
            target, source = args[0], args[1] if func is aten.copy_.default else None
        else:
            return out
        if target.dtype == self.dtype and target.dim() == 2 and not target.is_meta:
            self.peak = max(self.peak, self._live(source))
        return out

    def _live(self, source) -> int:
        skip = source.untyped_storage().data_ptr() if source is not None else None
        storages = {}
        for obj in gc.get_objects():
            if (isinstance(obj, torch.Tensor) and not obj.is_meta and obj.dtype == self.dtype
                    and tuple(obj.shape) in self.shapes):
                storage = obj.untyped_storage()
                if storage.data_ptr() != skip:
                    storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())


@pytest.fixture(scope="module")
def deeper_llama(tmp_path_factory):
    """A 4-layer tiny Llama whose linear weights' shapes are no other parameter's (the
    embeddings are 256 x 64, gate_up 192 x 64): (path, its fp8-dynamic checkpoint)."""
    import transformers as tf
    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp("deeper-llama"))
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**dict(TINY, intermediate_size=96,
                                                      num_hidden_layers=4))).eval()
    model.save_pretrained(path)
    fp8 = None
    try:
        from tests.quantization.fp8_checkpoints import write_fp8_checkpoint
        fp8 = str(tmp_path_factory.mktemp("deeper-llama-fp8"))
        write_fp8_checkpoint(model, fp8, "fp8-dynamic", ["lm_head"])
    except ImportError:  # compressed_tensors
        pass
    return path, fp8


@pytest.mark.parametrize("how", ["fp8", "dummy", "checkpoint"])
def test_peak_is_one_layer_in_the_models_dtype(how, deeper_llama):
    """At most one decoder layer's linear weights in bfloat16 are alive at any time during
    load_model (a checkpoint's sorted names put o_proj between k_proj and q_proj, so
    qkv_proj's staging waits beside o_proj's); before, all four layers' were."""
    path, fp8_path = deeper_llama
    if how == "checkpoint" and fp8_path is None:
        pytest.skip("compressed_tensors is not installed")
    plain = _load(path, dtype="bfloat16")
    layers = _linear_layers(plain)
    shapes = {tuple(m.weight.shape) for m in layers.values()}
    whole = sum(m.weight.nbytes for m in layers.values())
    one_layer = sum(m.weight.nbytes for n, m in layers.items() if ".layers.0." in n)
    kwargs = {"checkpoint": dict(model=fp8_path), "fp8": dict(quantization="fp8"),
              "dummy": dict(quantization="fp8", load_format="dummy")}[how]
    kwargs = {"model": path, **kwargs, "dtype": "bfloat16"}
    del plain, layers
    gc.collect()
    with _LiveLinearWeights(torch.bfloat16, shapes) as live:
        model = _load(kwargs.pop("model"), **kwargs)
    assert all(m.weight.dtype == FP8 for m in _linear_layers(model).values())
    assert whole == 4 * one_layer
    assert live.peak <= one_layer, (live.peak, one_layer, whole)
