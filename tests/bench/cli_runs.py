"""`loom bench latency` / `throughput` on the tiny model on the CPU, as the bench tests run
them."""
from __future__ import annotations

import sys

from loom.cli import main


def latency_cli(tiny: str, out_json, monkeypatch, *extra: str) -> int:
    argv = ["bench", "latency", "--model", tiny, "--device", "cpu", "--input-len", "8",
            "--batch-size", "2", "--num-iters", "2", "--num-iters-warmup", "1",
            "--max-model-len", "64", "--output-json", str(out_json), *extra]
    monkeypatch.setattr(sys, "argv", ["loom", *argv])
    return main(argv)


def throughput_cli(tiny: str, out_json, monkeypatch, *extra: str) -> int:
    """6 prompts of 8 tokens -> 4 outputs; extra flags after (a later flag wins)."""
    argv = ["bench", "throughput", "--model", tiny, "--device", "cpu", "--input-len", "8",
            "--output-len", "4", "--num-prompts", "6", "--max-model-len", "64",
            "--output-json", str(out_json), *extra]
    monkeypatch.setattr(sys, "argv", ["loom", *argv])
    return main(argv)
