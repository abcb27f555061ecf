"""What Python's collector finds in a serving engine on the GPU: a tiny Llama served with
the GPU defaults (level 3, CUDA graphs, async scheduling), the collector saving everything
it would free (gc.DEBUG_SAVEALL) while 200 requests run, then the kinds of cyclic garbage a
run leaves, and how long collections of each generation took with and without it.

run_zzp: in an 8B / Qwen3 throughput run, full collections walked ~20k objects yet took
60-120 ms each, gen0 ones 0.43 ms on average: either their garbage is costly to free (CUDA
objects in reference cycles) or something else runs inside them.

    python3 gc_probe.py [--json OUT]
"""
import argparse
import collections
import gc
import json
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, ".")
from tests.conftest import make_tiny_model  # noqa: E402

from loom import LLM, SamplingParams  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--json", default=None)
parser.add_argument("--cpu", action="store_true", help="a dry run on the CPU")
args = parser.parse_args()
path = tempfile.mkdtemp()
make_tiny_model("llama", path)
llm = LLM(model=path, device="cpu" if "--cpu" in sys.argv else "cuda", max_model_len=512, skip_tokenizer_init=True)
rng = np.random.default_rng(0)
prompts = [{"prompt_token_ids": rng.integers(0, 100, 200).tolist()} for _ in range(200)]
params = SamplingParams(max_tokens=64, ignore_eos=True, temperature=1.0)
result = {"callbacks": [repr(c) for c in gc.callbacks]}
pauses = collections.defaultdict(list)
began = [0.0]


def timer(phase, info):
    if phase == "start":
        began[0] = time.perf_counter()
    else:
        pauses[info["generation"]].append((time.perf_counter() - began[0], info["collected"]))


for label, debug in (("plain", 0), ("saveall", gc.DEBUG_SAVEALL)):
    gc.collect()
    pauses.clear()
    gc.callbacks.append(timer)
    gc.set_debug(debug)
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    gc.callbacks.remove(timer)
    row = {"elapsed_s": elapsed}
    for g, p in sorted(pauses.items()):
        row[f"gen{g}"] = {"n": len(p), "total_ms": 1e3 * sum(t for t, _ in p),
                          "max_ms": 1e3 * max(t for t, _ in p),
                          "collected": sum(c for _, c in p)}
    if debug:
        gc.collect()
        kinds = collections.Counter(type(o).__module__ + "." + type(o).__qualname__
                                    for o in gc.garbage)
        row["garbage"] = len(gc.garbage)
        row["garbage_kinds"] = kinds.most_common(30)
        gc.set_debug(0)
        gc.garbage.clear()
    result[label] = row
    print(label, json.dumps(row, indent=1), flush=True)
print("other gc callbacks:", result["callbacks"])
if args.json:
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
