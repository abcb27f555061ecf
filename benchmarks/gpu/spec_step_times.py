"""Wall time of each step of greedy batch-1 generation, split into plain decodes and
speculative verify steps (by the drafts the scheduler put in them), from the engine's step
observer (`loom.bench.step_log.StepLog`: the time between two read-backs).

A plain decode runs ahead of its predecessor, so its period is its device time; nothing runs
ahead of a verify step, so its period is its device time plus the host time the device
waited for (read-back, proposal, scheduling, the next launch's host work). Set against the
step's kernel time from a profile, the difference is what running verify steps ahead could
take.

    python3 spec_step_times.py --model llama-3.1-8b --load-format dummy \
        --speculative-config '{...}' [--input-len 128] [--output-len 128] [--iters 4] [--json OUT]
"""
import argparse
import json
import statistics
import sys

import numpy as np

sys.path.insert(0, ".")
from loom.bench.common import command_line, git_commit  # noqa: E402
from loom.bench.offline import add_offline_args, setup_offline  # noqa: E402
from loom.bench.step_log import StepLog  # noqa: E402
from loom.sampling_params import SamplingParams  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--input-len", type=int, default=128)
parser.add_argument("--output-len", type=int, default=128)
parser.add_argument("--iters", type=int, default=4)
parser.add_argument("--json", default=None)
add_offline_args(parser)
args = parser.parse_args()
bench = setup_offline(args)
rng = np.random.default_rng(0)
params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
bench.llm.generate(bench.random_prompts(rng, 1, args.input_len), params, use_tqdm=False)
kinds: dict[str, list[float]] = {}
tokens_out = 0
for _ in range(args.iters):
    log = bench.llm.engine.step_observer = StepLog()
    log.start()
    out = bench.llm.generate(bench.random_prompts(rng, 1, args.input_len), params,
                             use_tqdm=False)
    log.stop()
    bench.llm.engine.step_observer = None
    tokens_out += len(out[0].outputs[0].token_ids)
    for step in log.steps[1:]:  # the first is the prompt's
        kind = "decode" if step.decode_tokens == 1 else f"verify {step.decode_tokens}"
        kinds.setdefault(kind, []).append(step.seconds * 1e3)
result = {"model": args.model, "speculative_config": args.speculative_config,
          "git_commit": git_commit(), "command": command_line(), "device": bench.device,
          "ceilings": vars(bench.ceilings) if bench.ceilings else None,
          "tokens_out": tokens_out, "kinds": {}}
for kind, ms in sorted(kinds.items()):
    row = {"steps": len(ms), "median_ms": statistics.median(ms), "mean_ms": statistics.fmean(ms),
           "p10_ms": float(np.percentile(ms, 10)), "p90_ms": float(np.percentile(ms, 90))}
    result["kinds"][kind] = row
    print(f"{kind:>10}: {row['steps']:4d} steps, median {row['median_ms']:.3f} ms "
          f"(p10 {row['p10_ms']:.3f}, p90 {row['p90_ms']:.3f}, mean {row['mean_ms']:.3f})")
if args.json:
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
bench.llm.shutdown()
