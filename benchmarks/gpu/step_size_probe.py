"""A served model's first step at each of several prompt sizes: one prompt per call, each
size twice (fresh random tokens both times), with the Triton compiles each call caused.

The first call of a size pays whatever that size compiles (a fused-MoE config of its own,
~1 s, before the MoE warm-up); the second shows the step without it.

    python3 step_size_probe.py --model qwen3-30b-a3b [--lens 333,3001] [--json OUT]
"""
import argparse
import json
import logging
import sys
import time

import numpy as np

sys.path.insert(0, ".")
from loom import LLM, SamplingParams  # noqa: E402
from loom.kernels import jit_watch  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", required=True)
parser.add_argument("--lens", default="37,333,777,1501,3001,6007,12011")
parser.add_argument("--json", default=None)
args = parser.parse_args()
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
start = time.perf_counter()
llm = LLM(model=args.model, load_format="dummy", skip_tokenizer_init=True)
result = {"model": args.model, "start_up_s": time.perf_counter() - start, "calls": []}
print(f"start-up {result['start_up_s']:.1f} s", flush=True)
rng = np.random.default_rng(0)
params = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0)
for n in [int(x) for x in args.lens.split(",")]:
    for attempt in (1, 2):
        before = len(jit_watch.compiles())
        prompt = {"prompt_token_ids": rng.integers(0, 30000, n).tolist()}
        t = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        elapsed = time.perf_counter() - t
        new = jit_watch.compiles()[before:]
        row = {"tokens": n, "call": attempt, "seconds": elapsed,
               "compiles": [[name, secs] for name, secs in new]}
        result["calls"].append(row)
        print(f"{n:6d} tokens, call {attempt}: {1e3 * elapsed:8.1f} ms, {len(new)} compiles "
              f"{[name for name, _ in new]}", flush=True)
if args.json:
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
