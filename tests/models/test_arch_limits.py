"""What the architectures added in session 48 refuse, as `ModelArch` and `model_targets`
see them (no engine runs here): OLMo's tensor parallelism, GLM-4's adapters, Arcee's
adapters on its lone up_proj."""

from __future__ import annotations

import pytest

from tests.models.test_arch import _arch


def test_olmo2_runs_on_one_device():
    arch = _arch("Olmo2ForCausalLM")
    arch.check_tensor_parallel(1)
    with pytest.raises(ValueError, match="tensor_parallel_size: Olmo2ForCausalLM runs on one"):
        arch.check_tensor_parallel(2)


def test_glm4_refuses_adapters():
    """GLM-4's q/k rows are reordered as they load; an adapter's would need the same."""
    from loom.lora.adapter import model_targets
    with pytest.raises(ValueError, match="LoRA adapters on Glm4ForCausalLM are not supported"):
        model_targets(_arch("Glm4ForCausalLM", head_dim=16, partial_rotary_factor=0.5))


def test_arcee_adapters_leave_its_lone_up_proj():
    """Arcee's MLP is up_proj then down_proj: adapters may target down_proj, not up_proj
    (loom's adapter slices are for gate_up_proj's halves)."""
    from loom.lora.adapter import model_targets
    targets = model_targets(_arch("ArceeForCausalLM"))
    mlp = {name.rsplit(".", 1)[1] for name in targets if ".mlp." in name}
    assert mlp == {"down_proj"}
