"""Norms are one custom-op node each while the passes match, then turned back into aten
ops by the last pass, so Inductor fuses them: no extern call per norm in the output code."""

from __future__ import annotations

import pytest
import torch
import torch._functorch.config
import torch._inductor.config
from torch._inductor.utils import run_and_get_code

from loom.attention.torch_native import TorchNativeBackend
from loom.compilation.backend import CompiledForward
from loom.config import CompilationConfig, EngineConfig, ModelConfig
from loom.forward_context import ForwardContext, forward_context
from loom.worker.model_loader import load_model


@pytest.mark.slow
@torch._inductor.config.patch(fx_graph_cache=False)  # the passes must run
@torch._functorch.config.patch(enable_autograd_cache=False)
def test_norms_are_decomposed_and_fused(tiny_model_factory):
    # Not monkeypatch: undoing a setattr on a torch config module deletes the option, and
    # every later compile in this process then fails to read it.
    torch._dynamo.reset()
    path, _ = tiny_model_factory("qwen3")  # q/k norms too: 3-D inputs, strided views
    model, _, _ = load_model(EngineConfig(model=ModelConfig(path, dtype="float32")),
                             torch.device("cpu"))
    compiled = CompiledForward(model, CompilationConfig(level=3, splitting_ops=()),
                               enforce_eager=False, tp_size=1)
    decompose = compiled.pass_manager.passes[-1]
    decomposed = []
    compiled.pass_manager.passes[-1] = lambda graph: decomposed.append(decompose(graph))
    ids, positions = torch.randint(0, 256, (9,)), torch.arange(9)
    with torch.no_grad(), forward_context(ForwardContext(None, [], TorchNativeBackend())):
        out, code = run_and_get_code(compiled, ids, positions)
        expected = model(ids, positions)
    layers = 2  # per layer: input, post-attention, q and k norms; then the final norm
    assert decomposed == [4 * layers + 1]
    source = "\n".join(code)
    assert "loom.rms_norm" not in source and "loom.fused_add_rms_norm" not in source
    assert source.count("loom.attention") > 0  # the code inspected is the model's
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
