"""LoRA adapters served beside their base model (vLLM's --enable-lora)."""
