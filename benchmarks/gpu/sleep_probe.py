"""Sleep mode at Llama-3.1-8B shapes (dummy bf16 weights, default compile and CUDA
graphs): device memory freed by a level 1 and a level 2 sleep, the time of each sleep,
wake-up and weight reload, and greedy tokens and batch-1 decode time before and after.

    python3 benchmarks/gpu/sleep_probe.py --json OUT [--model llama-3.1-8b]
"""
import argparse
import dataclasses
import json
import sys
import time

import torch

sys.path.insert(0, ".")
from loom import LLM, SamplingParams  # noqa: E402
from loom.bench.ceilings import measure_ceilings  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--json", required=True)
parser.add_argument("--model", default="llama-3.1-8b")
args = parser.parse_args()
ceil = measure_ceilings(torch.device("cuda"))
llm = LLM(args.model, load_format="dummy", skip_tokenizer_init=True, max_model_len=2048,
          enable_sleep_mode=True)
prompts = [{"prompt_token_ids": [(7 * i + 13 * j) % 5000 + 10 for j in range(128)]}
           for i in range(4)]
greedy = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)


def tokens() -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, greedy, use_tqdm=False)]


def decode_ms() -> float:
    one = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    llm.generate(prompts[:1], one, use_tqdm=False)
    torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate(prompts[:1], one, use_tqdm=False)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / 128


def timed(fn, *a, **k) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn(*a, **k)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def free() -> int:
    return torch.cuda.mem_get_info()[0]


def host_copy_rates(nbytes: int = 2**30) -> dict:
    """Bytes/s of a pinned device-to-host and host-to-device copy: the floor of a level 1
    sleep's backup and wake-up."""
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    rates = {}
    for name, dst, src in (("d2h", host, dev), ("h2d", dev, host)):
        dst.copy_(src)
        rates[name] = max(nbytes / timed(dst.copy_, src) for _ in range(5))
    return rates


result = {"ceilings": dataclasses.asdict(ceil), "device": torch.cuda.get_device_name(),
          "model": args.model, "total_bytes": torch.cuda.mem_get_info()[1]}
ref, result["decode_ms_before"] = tokens(), decode_ms()
result["host_copy_bytes_per_s"] = host_copy_rates()
for level in (1, 1, 2):
    if level == 1 and "level1_sleep_s" in result:  # the second cycle: its buffer kept
        result["level1_first_sleep_s"] = result["level1_sleep_s"]
    before = free()
    result[f"level{level}_sleep_s"] = timed(llm.sleep, level=level)
    result[f"level{level}_freed_bytes"] = free() - before
    result[f"level{level}_free_asleep_bytes"] = free()
    if level == 1:
        result["level1_wake_s"] = timed(llm.wake_up)
    else:
        result["level2_wake_weights_s"] = timed(llm.wake_up, tags=["weights"])
        result["level2_reload_s"] = timed(llm.collective_rpc, "reload_weights")
        result["level2_wake_kv_s"] = timed(llm.wake_up, tags=["kv_cache"])
    result[f"level{level}_tokens_equal"] = tokens() == ref
    print(json.dumps({k: v for k, v in result.items() if k.startswith(f"level{level}")}),
          flush=True)
result["decode_ms_after"] = decode_ms()
print(f"decode {result['decode_ms_before']:.3f} -> {result['decode_ms_after']:.3f} ms/token",
      flush=True)
llm.shutdown()
with open(args.json, "w") as f:
    json.dump(result, f, indent=1)
