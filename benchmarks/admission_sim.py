"""Replay `loom bench throughput`'s workload through loom's real Scheduler on the CPU, no model,
and set every step it makes against the step floors of `loom.bench.step_log` (the same two
classes a GPU run's `--step-breakdown` reports). It shows what an admission policy costs in
steps, recomputed prompt tokens and floor seconds before a GPU is spent on it.

The KV cache size (blocks) and the ceilings are inputs: take them from a GPU run of the same
model (the defaults are run_x's 8B run, `h200x2-throughput-defaults-moe-op-3485478/`: 55561
blocks of 16 tokens, copy 4.248 TB/s, matmul 773.1 TFLOP/s). The fake model samples one
token per finished prompt or decode, so every request runs to max_tokens (ignore_eos), as
in the benchmark. Scheduling is synchronous (each step's tokens are known before the next
is scheduled); the engine's async scheduling launches the same steps one step earlier.

    python benchmarks/admission_sim.py --output-json benchmarks/results/<dir>/summary.json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

from loom.bench.common import command_line, git_commit, now_iso
from loom.bench.step_log import StepLog, breakdown
from loom.config import CacheConfig, ModelConfig, SchedulerConfig
from loom.core.request import Request
from loom.core.sched_output import ModelRunnerOutput
from loom.core.scheduler import Scheduler
from loom.models.arch import ModelArch
from loom.models.loader import resolve
from loom.sampling_params import SamplingParams


@dataclass(frozen=True)
class GivenCeilings:
    device: str
    copy_tb_per_s: float
    matmul_tflop_per_s: float


def simulate(arch: ModelArch, num_blocks: int, block_size: int, max_num_seqs: int,
             max_num_batched_tokens: int, headroom: int, num_prompts: int, input_len: int,
             output_len: int, seed: int) -> tuple[StepLog, int]:
    """The run's steps, and the preemptions the scheduler made."""
    sched = Scheduler(SchedulerConfig(max_num_seqs, max_num_batched_tokens, False,
                                      kv_headroom_tokens=headroom),
                      CacheConfig(block_size=block_size), num_blocks,
                      arch.max_position_embeddings)
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)
    for i in range(num_prompts):
        prompt = [rng.randrange(arch.vocab_size) for _ in range(input_len)]
        sched.add_request(Request(str(i), prompt, params))
    log, preemptions = StepLog(), 0
    while sched.has_unfinished_requests():
        out = sched.schedule()
        log.launched(out, sched)
        sampled = [[1] if sched.requests[rid].num_computed_tokens
                   >= sched.requests[rid].num_tokens else []
                   for rid in out.num_scheduled_tokens]
        sched.update_from_output(out, ModelRunnerOutput(list(out.num_scheduled_tokens), sampled))
        log.collected()
        preemptions += sched.make_stats().num_preemptions
    return log, preemptions


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--num-blocks", type=int, default=55561)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--batch-limits", nargs="+", default=["1024,16384", "256,8192"],
                   help="max_num_seqs,max_num_batched_tokens pairs")
    p.add_argument("--headrooms", type=int, nargs="+", default=[0, 512])
    p.add_argument("--copy-tbps", type=float, default=4.2476)
    p.add_argument("--matmul-tflops", type=float, default=773.08)
    p.add_argument("--ceilings-from", default="H200, run_x (3485478) gpu0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-json")
    args = p.parse_args()

    arch = ModelArch.from_hf_config(resolve(ModelConfig(model=args.model, load_format="dummy")).hf_config)
    ceilings = GivenCeilings(args.ceilings_from, args.copy_tbps, args.matmul_tflops)
    runs = []
    for limits in args.batch_limits:
        seqs, tokens = (int(v) for v in limits.split(","))
        for headroom in args.headrooms:
            start = time.perf_counter()
            log, preemptions = simulate(arch, args.num_blocks, args.block_size, seqs, tokens,
                                        headroom, args.num_prompts, args.input_len,
                                        args.output_len, args.seed)
            rows = breakdown(log, arch, 2, 1, ceilings)
            for row in rows.values():
                row.pop("seconds"), row.pop("ratio_to_floor")  # no device: no times
            prompt = sum(r["prompt_tokens"] for r in rows.values())
            run = {"max_num_seqs": seqs, "max_num_batched_tokens": tokens,
                   "kv_headroom_tokens": headroom, "steps": len(log.steps),
                   "preemptions": preemptions,
                   "recomputed_prompt_share": prompt / (args.num_prompts * args.input_len) - 1,
                   "floor_s": sum(r["floor_s"] for r in rows.values()),
                   "step_breakdown": rows,
                   "simulated_in_s": time.perf_counter() - start}
            runs.append(run)
            print(f"{seqs} seqs / {tokens} tokens, headroom {headroom}: {run['steps']} steps, "
                  f"{preemptions} preemptions, {run['recomputed_prompt_share']:.1%} prompt "
                  f"tokens recomputed, summed step floors {run['floor_s']:.2f} s", flush=True)
    result = {"benchmark": "scheduler admission replay (CPU, no model) against step floors",
              "date": now_iso(), "git_commit": git_commit(), "command": command_line(),
              "device": "CPU replay; floors at the given ceilings",
              "ceilings": {"from": args.ceilings_from, "copy_tb_per_s": args.copy_tbps,
                           "matmul_tflop_per_s": args.matmul_tflops},
              "workload": {"model": args.model, "num_prompts": args.num_prompts,
                           "input_len": args.input_len, "output_len": args.output_len,
                           "num_blocks": args.num_blocks, "block_size": args.block_size},
              "runs": runs}
    if args.output_json:
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
