"""PEFT adapters for tests: made by peft itself on a tiny transformers model, so that the
reference outputs (the peft model's) come from code nobody here wrote."""

from __future__ import annotations

import os
import struct

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_adapter(base_path: str, out_dir: str, targets=ALL_TARGETS, r: int = 8,
                 alpha: int = 16, seed: int = 1, use_rslora: bool = False):
    """Save a LoRA adapter for the model at base_path into out_dir; return the peft model
    (base + adapter, eval mode) that defines what it computes. Its A and B are random
    (peft's own init leaves B zero, which would change nothing)."""
    import peft
    import torch
    import transformers as tf
    base = tf.AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    torch.manual_seed(seed)
    config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets),
                             init_lora_weights=False, use_rslora=use_rslora)
    model = peft.get_peft_model(base, config)
    with torch.no_grad():  # large enough to change greedy tokens, small enough to keep
        for name, p in model.named_parameters():  # logits well apart
            if "lora_" in name:
                p.normal_(0.0, 0.25 if "lora_A" in name else 0.5)
    model.save_pretrained(out_dir)
    return model.eval()


def poison(adapter_dir: str) -> str:
    """Put one NaN into one of an adapter's A matrices: the frontend's check (config and
    header) passes, the workers' load refuses it. Returns adapter_dir."""
    import torch
    from safetensors.torch import load_file, save_file
    file = os.path.join(adapter_dir, "adapter_model.safetensors")
    tensors = load_file(file)
    name = next(n for n in sorted(tensors) if "lora_A" in n)
    tensors[name][0, 0] = torch.nan
    save_file(tensors, file, metadata={"format": "pt"})
    return adapter_dir


def cut_short(adapter_dir: str) -> str:
    """Cut an adapter's safetensors file just past its header: the frontend's check refuses
    it; one it checked before reads fail in the workers. Returns adapter_dir."""
    file = os.path.join(adapter_dir, "adapter_model.safetensors")
    with open(file, "rb") as f:
        (header,) = struct.unpack("<Q", f.read(8))
    os.truncate(file, 8 + header + 16)
    return adapter_dir
