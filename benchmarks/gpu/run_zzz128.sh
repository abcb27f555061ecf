# 1 GPU (~6 min), session 52. How a verify step's wall time grows with the batch, from
# `loom bench latency`'s new step line (c396290: verify steps and plain decodes timed apart,
# the median of the timed iterations' steps). Greedy, 8B, 128 -> 128, dummy weights.
# run_zzz127 at batch 1: n-gram verify 7.241 ms against a plain decode's 5.437 (kernels
# ~6.2 ms: ~1 ms of host time the device waits for); the 1B drafting 4: 12.993 ms.
# Here n-gram k=4 at batch 1 / 8 / 32, and the 1B drafting 4 at batch 8.
source benchmarks/gpu/env.sh; R=/tmp/zzz128; mkdir -p $R
L="--load-format dummy --num-iters-warmup 2 --num-iters 3 --input-len 128 --output-len 128 --temperature 0"
NG='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
D4='{"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4}'
step() { grep -E "a step, median" $R/$1.log | cut -c1-200; }
lat ngram-b1 llama-3.1-8b 110 --batch-size 1 --speculative-config "$NG"; step ngram-b1
lat ngram-b8 llama-3.1-8b 190 --batch-size 8 --speculative-config "$NG"; step ngram-b8
lat ngram-b32 llama-3.1-8b 270 --batch-size 32 --speculative-config "$NG"; step ngram-b32
pack ngram-b1.log ngram-b1.json ngram-b8.log ngram-b8.json ngram-b32.log ngram-b32.json
lat draft-b8 llama-3.1-8b 390 --batch-size 8 --speculative-config "$D4"; step draft-b8
pack draft-b8.log draft-b8.json
stamp done
