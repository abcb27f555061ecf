"""`LoRARequest`: which adapter a request runs with (vLLM's, field for field)."""

from __future__ import annotations

import os

import msgspec


class LoRARequest(msgspec.Struct, array_like=True, omit_defaults=True):
    """A PEFT adapter directory (adapter_config.json + adapter_model.safetensors) to apply
    to one request; lora_path may be a Hugging Face Hub id in the local cache, as in vLLM
    (its snapshot folder replaces it here). lora_int_id identifies the adapter everywhere in
    the engine (cache slots, prefix-cache keys): two requests with the same id must name the
    same adapter."""
    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name: must be a non-empty string, got {self.lora_name!r}")
        if type(self.lora_int_id) is not int or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id: must be an integer >= 1, got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"lora_path: must name the adapter's directory, got "
                             f"{self.lora_path!r}")
        if not os.path.exists(self.lora_path):  # a Hub id: its snapshot in the local cache
            from loom.models.names import resolve_name
            self.lora_path = resolve_name(self.lora_path, None, None, "lora_path")
