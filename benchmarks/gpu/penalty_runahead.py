"""Decode whose sampling reads each request's outputs (repetition and frequency penalties)
against plain sampling, with async scheduling on or off: seconds per 128 -> 128 batch at
batch 1 and 64, random prompts, ignore_eos, dummy weights. Until session 65 a penalized
request never ran ahead of its sampled token, which is what async off shows for it; now the
driver reads its token in flight back before it samples.

python penalty_runahead.py on|off OUT.json [MODEL]"""

import json
import random
import statistics
import sys
import time

from loom import LLM, SamplingParams

mode, out = sys.argv[1], sys.argv[2]
model = sys.argv[3] if len(sys.argv) > 3 else "llama-3.1-8b"
llm = LLM(model, load_format="dummy", skip_tokenizer_init=True, max_model_len=512,
          async_scheduling=mode == "on", cudagraph_capture_sizes=[1, 64])
rng = random.Random(0)
vocab = llm.engine.vocab_size
results = {}
for batch in (1, 64):
    prompts = [{"prompt_token_ids": [rng.randrange(100, vocab - 1) for _ in range(128)]}
               for _ in range(batch)]
    for name, extra in (("plain", {}),
                        ("penalties", dict(repetition_penalty=1.1, frequency_penalty=0.2))):
        params = SamplingParams(temperature=1.0, max_tokens=128, ignore_eos=True, **extra)
        llm.generate(prompts, params, use_tqdm=False)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            times.append(time.perf_counter() - start)
            assert all(len(o.outputs[0].token_ids) == 128 for o in outs)
        results[f"{name}-b{batch}"] = statistics.median(times)
        print(f"async {mode} {name:9s} batch {batch:2d}: {statistics.median(times):.4f} s "
              f"({statistics.median(times) / 128 * 1e3:.3f} ms/token; runs "
              f"{min(times):.4f}-{max(times):.4f})", flush=True)
llm.shutdown()
with open(out, "w") as f:
    json.dump({"async_scheduling": mode, "model": model, "seconds": results}, f, indent=1)
