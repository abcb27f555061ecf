# x2: why TP=2 decode is 3.3 ms/token, not 2.6: rank 0's one-shot all-reduces averaged 13.9 us in a step
# against rank 1's 7.0 (h200-profile-decode-94c6b95): one rank waits for the other. Both ranks' traces,
# then the same decode with NCCL for every all-reduce (LOOM_SYMM_ALL_REDUCE_MAX_BYTES=0); then 1-GPU decode with
# Inductor's max-autotune beside the default.
source benchmarks/gpu/env.sh
R=/tmp/e; mkdir -p $R
TP2="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 -tp 2 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 150 $LOOM bench latency $TP2 --profile --profile-result-dir $R/prof --output-json $R/tp2-decode.json > $R/tp2.log 2>&1; grep -E "^Decode|^All-reduce" $R/tp2.log
LOOM_SYMM_ALL_REDUCE_MAX_BYTES=0 timeout 120 $LOOM bench latency $TP2 --output-json $R/tp2-decode-nccl.json > $R/tp2-nccl.log 2>&1; grep -E "^Decode|^All-reduce" $R/tp2-nccl.log
python3 - $R/prof <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/trace-rank*.json")):
    ev = sorted((e for e in json.load(open(f))["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy")), key=lambda e: e["ts"])
    span = ev[-1]["ts"] + ev[-1]["dur"] - ev[0]["ts"]; busy = sum(e["dur"] for e in ev)
    ar = [e["dur"] for e in ev if "one_shot" in e["name"]]
    print(f, "span %.1f ms busy %.1f ms idle %.1f ms; one-shot n %d mean %.1f us, max %.1f" % (span / 1e3, busy / 1e3, (span - busy) / 1e3, len(ar), sum(ar) / max(1, len(ar)), max(ar or [0])))
PY
stamp one-gpu
# Inductor's max-autotune on the one-token graph: can a Triton GEMM avoid cuBLAS's split-K reduce kernels (2 per layer)?
M8="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5"
( CUDA_VISIBLE_DEVICES=0 timeout $(( 585 - ($(date +%s) - T0) )) $LOOM bench latency $M8 -O '{"level":3,"inductor_compile_config":{"max_autotune":true}}' --output-json $R/decode-autotune.json > $R/decode-autotune.log 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 timeout 150 $LOOM bench latency $M8 -O 3 --output-json $R/decode.json > $R/decode.log 2>&1 ) &
wait; grep -E "^Decode" $R/decode.log $R/decode-autotune.log
tar czf $OUT/e.tgz -C $R . ; stamp done
