"""Host time of one step's LoRA bookkeeping in the worker (`LoRAManager.prepare`: the
step's adapters into slots, then the per-token mask), on the CPU, with 8B shapes, 4 slots
of rank 16, a decode batch of 1, 64 and 256 requests over 4 adapters, and base-model steps.
Adapter loading is left out (stubbed): it happens once per adapter, not per step. Prints
JSON (device, commit, command, figures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import torch
from torch import nn

from loom.config import LoRAConfig
from loom.distributed.parallel_state import init_distributed
from loom.lora.manager import LoRAManager
from loom.lora.request import LoRARequest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stream_parse_costs import cpu_name  # noqa: E402

ARCH_8B = SimpleNamespace(num_heads=32, num_kv_heads=8, head_dim=128, hidden_size=4096,
                          intermediate_size=14336, num_layers=32, is_moe_layer=lambda i: False)


def _per_call_us(fn, calls: int = 2000) -> float:
    for _ in range(50):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    init_distributed(1, 0, "tcp://127.0.0.1:29533", "gloo")
    manager = LoRAManager(nn.Module(), ARCH_8B, LoRAConfig(max_loras=4, max_lora_rank=16),
                          16384 + 256, torch.device("cpu"), torch.bfloat16)
    manager._load = lambda lora: {}  # no layers here: the bookkeeping alone
    loras = [LoRARequest(f"a{i}", i, "/adapters") for i in range(1, 5)]
    figures = {}
    for n in (1, 64, 256):
        mixed, counts = [loras[i % 4] for i in range(n)], [1] * n
        figures[f"batch_{n}_4_adapters_us"] = round(_per_call_us(
            lambda: manager.prepare(mixed, counts, n)), 1)
        manager.prepare([None] * n, counts, n)
        figures[f"batch_{n}_base_only_us"] = round(_per_call_us(
            lambda: manager.prepare([None] * n, counts, n)), 2)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(json.dumps({"benchmark": "lora_prepare_cost", "device": cpu_name(), "git_commit": commit,
                      "command": " ".join(["python", *sys.argv]), "ceilings": None,
                      "figures": figures}, indent=1))


if __name__ == "__main__":
    main()
