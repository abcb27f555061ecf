"""Step #1 of every stored throughput run (1000 x 1024 -> 256, with `--step-breakdown`), set
against the median prompt step, with the requests' intake taken out.

Until session 57, `StepLog` timed step #1 from the start of the run, so the time to take in
the requests (the JSON's `first_step_launched_s`) was inside step #1. This reads every
stored run's step #1 (when it is among the five slowest prompt steps the JSON keeps), takes
the intake out and prints its own time as a multiple of the median prompt step. What is
left (~1.9x) is step #2's device time, read back with step #1's (run_zzz142).

    python benchmarks/first_step.py [--output-json OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def first_steps() -> list[dict]:
    rows = []
    for path in sorted(RESULTS.rglob("*.json")):
        try:
            run = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            continue
        if not isinstance(run, dict) or (run.get("input_len"), run.get("num_prompts")) != (
                1024, 1000) or not run.get("first_step_launched_s"):
            continue
        prompt = (run.get("step_breakdown") or {}).get("with_prompt")
        first = [s for s in (prompt or {}).get("slowest_steps", []) if s["step"] == 1]
        if not first:
            continue
        # Runs with a step table (session 58 on) timed step #1 from its launch already.
        own = first[0]["seconds"] - (0.0 if "steps" in run else run["first_step_launched_s"])
        rows.append({"file": str(path.relative_to(RESULTS)), "device": run.get("device"),
                     "model": Path(str(run.get("engine_args", {}).get("model", "?"))).name,
                     "step1_logged_s": first[0]["seconds"],
                     "intake_s": run["first_step_launched_s"], "step1_own_s": own,
                     "median_prompt_step_s": prompt["median_step_s"],
                     "own_over_median": own / prompt["median_step_s"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-json")
    args = parser.parse_args()
    rows = first_steps()
    for r in rows:
        print(f"{r['file'][:58]:58} {r['model'][:16]:16} step #1 {r['step1_logged_s'] * 1e3:5.0f}"
              f" ms, intake {r['intake_s'] * 1e3:4.0f}, own {r['step1_own_s'] * 1e3:5.0f} = "
              f"{r['own_over_median']:.2f}x the median {r['median_prompt_step_s'] * 1e3:.0f}")
    if args.output_json:
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_json).write_text(json.dumps({
            "what": __doc__.splitlines()[0], "command": "python benchmarks/first_step.py",
            "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
