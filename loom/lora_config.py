"""`LoRAConfig`, part of `loom.config.EngineConfig` (re-exported there). Nothing here
imports torch."""

from __future__ import annotations

from dataclasses import dataclass

from loom.config_checks import check as _check

LORA_DTYPES = ("auto", "bfloat16", "float16", "float32")

@dataclass(frozen=True)
class LoRAConfig:
    """LoRA adapters beside the base model (vLLM's --enable-lora): each step's requests may
    use up to max_loras different adapters, held on the device in that many slots."""
    max_loras: int = 1
    """Adapters one step may use (device slots); requests with others wait their turn."""
    max_lora_rank: int = 16
    """The largest adapter rank accepted; every slot is this wide."""
    max_cpu_loras: int | None = None
    """Adapters kept loaded in host memory, ready for a slot; None: max_loras."""
    lora_dtype: str = "auto"
    """vLLM's --lora-dtype: auto (the model's dtype) or the model's dtype by name; loom's
    LoRA layers compute in the model's dtype, so another is refused when the model loads."""

    def __post_init__(self) -> None:
        for name in ("max_loras", "max_lora_rank"):
            value = getattr(self, name)
            _check(type(value) is int and value > 0,
                   f"{name}: must be a positive integer, got {value!r}")
        _check(self.max_cpu_loras is None or (type(self.max_cpu_loras) is int
                                              and self.max_cpu_loras >= self.max_loras),
               f"max_cpu_loras: must be an integer >= max_loras ({self.max_loras}), got "
               f"{self.max_cpu_loras!r}")
        _check(self.lora_dtype in LORA_DTYPES,
               f"lora_dtype: {self.lora_dtype!r} is not one of {LORA_DTYPES}")

    @property
    def cpu_loras(self) -> int:
        return self.max_cpu_loras or self.max_loras
