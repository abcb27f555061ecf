"""`loom bench latency` on the tiny model on the CPU, as the bench tests run it."""
from __future__ import annotations

import sys

from loom.cli import main


def latency_cli(tiny: str, out_json, monkeypatch, *extra: str) -> int:
    argv = ["bench", "latency", "--model", tiny, "--device", "cpu", "--input-len", "8",
            "--batch-size", "2", "--num-iters", "2", "--num-iters-warmup", "1",
            "--max-model-len", "64", "--output-json", str(out_json), *extra]
    monkeypatch.setattr(sys, "argv", ["loom", *argv])
    return main(argv)
