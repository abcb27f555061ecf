"""What --quantization fp8 costs in accuracy, on the CPU: the demo model (SmolLM2-135M-
Instruct, its GGUF dequantized) reads English text (the docstrings of a few standard-library
modules) in float32 and in fp8; per text, the perplexity of its own tokens and how often
the two agree on the most likely next token. Prints JSON (device, commit, command,
figures)."""

from __future__ import annotations

import argparse
import csv
import difflib
import heapq
import json
import math
import os
import subprocess
import sys
import unittest

from loom import LLM, SamplingParams

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stream_parse_costs import cpu_name  # noqa: E402

TEXTS = {m.__name__: m.__doc__ for m in (argparse, csv, difflib, heapq, json, unittest)}


def _read(llm: LLM) -> dict[str, tuple[list[float], list[int]]]:
    """Per text: the logprob of each of its tokens, and the top token at each position."""
    params = SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0.0)
    outs = llm.generate(list(TEXTS.values()), params, use_tqdm=False)
    read = {}
    for name, out in zip(TEXTS, outs):
        positions = out.prompt_logprobs[1:]
        actual = out.prompt_token_ids[1:]
        read[name] = ([p[t].logprob for p, t in zip(positions, actual)],
                      [next(t for t, lp in p.items() if lp.rank == 1) for p in positions])
    return read


def main() -> None:
    runs = {}
    for name, kwargs in (("float32", {}), ("fp8", {"quantization": "fp8"})):
        llm = LLM(dtype="float32", device="cpu", max_model_len=2048, **kwargs)
        runs[name] = _read(llm)
        llm.shutdown()
    figures = {}
    for text in TEXTS:
        (lp32, top32), (lp8, top8) = runs["float32"][text], runs["fp8"][text]
        figures[text] = {
            "tokens": len(lp32),
            "perplexity_float32": round(math.exp(-sum(lp32) / len(lp32)), 3),
            "perplexity_fp8": round(math.exp(-sum(lp8) / len(lp8)), 3),
            "top1_agreement": round(sum(a == b for a, b in zip(top32, top8)) / len(top32), 4)}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(json.dumps({"benchmark": "fp8_accuracy", "device": cpu_name(), "git_commit": commit,
                      "command": " ".join(["python", *sys.argv]), "ceilings": None,
                      "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)",
                      "figures": figures}, indent=1))


if __name__ == "__main__":
    main()
