"""Host time of a penalized step's token histories, on the CPU: the index tensors the
penalties scatter into [B, V] counts, built the way 0b4d032 built them (each request's
prompt and outputs sliced into Python lists, chained, then made tensors) and the way main
builds them (`sampling_metadata._histories`: spans of the worker's token table, gathered
with numpy). Both sides alternate in rounds; medians. Prints JSON (device, commit, command,
figures).

python benchmarks/cpu/penalty_history_cost.py [--rounds 20]"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

from loom.sampling_params import SamplingParams
from loom.worker.input_batch import CachedRequestState
from loom.worker.sampling_metadata import _histories

SHAPES = [(64, 128, 128), (256, 1024, 128), (256, 1024, 256)]
"""(batch, prompt tokens, output tokens so far)."""


def lists_then_tensors(reqs) -> None:
    """0b4d032's way: Python list slices, chained into flat index tensors."""
    outputs = [r.output_token_ids for r in reqs]
    prompts = [r.token_ids[:r.num_prompt_tokens] for r in reqs]
    for lists in (outputs, prompts):
        lengths = torch.tensor([len(ids) for ids in lists], dtype=torch.long)
        torch.repeat_interleave(torch.arange(len(lists)), lengths)
        torch.tensor(list(itertools.chain.from_iterable(lists)), dtype=torch.long)


def table_spans(reqs, table) -> None:
    for spans in _histories(reqs, table):
        row_of, flat = spans.flat()
        torch.from_numpy(row_of.astype(np.int64))
        torch.from_numpy(flat.astype(np.int64))


def ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=1.0, repetition_penalty=1.1, frequency_penalty=0.2)
    rows = []
    for batch, prompt, outputs in SHAPES:
        table = np.zeros((batch, prompt + outputs), dtype=np.int32)
        reqs = []
        for i in range(batch):
            ids = rng.integers(0, 128256, prompt + outputs)
            table[i] = ids
            reqs.append(CachedRequestState(str(i), ids.tolist(), prompt, params, [], None,
                                           row=i))
        before, after = [], []
        for _ in range(args.rounds):
            before.append(ms(lambda: lists_then_tensors(reqs)))
            after.append(ms(lambda: table_spans(reqs, table)))
        b, a = statistics.median(before), statistics.median(after)
        rows.append({"batch": batch, "prompt_tokens": prompt, "output_tokens": outputs,
                     "lists_ms": b, "table_spans_ms": a, "ratio": a / b})
        print(f"batch {batch}, {prompt} + {outputs} tokens: lists {b:.2f} ms, "
              f"table spans {a:.2f} ms ({a / b:.2f}x)", file=sys.stderr)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(json.dumps({"device": f"CPU ({platform.processor() or platform.machine()}, "
                                f"{torch.get_num_threads()} threads)",
                      "commit": commit, "command": " ".join(["python", *sys.argv]),
                      "rounds": args.rounds, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
