# 1 GPU (~8 min), session 52 (Qwen3 added in session 53). One split for a short context (LOOM_DECODE_ONE_SPLIT_KEYS, off
# by default). Decode graphs bake 32 splits (max_model_len), and a split covers cdiv(keys, 32)
# rounded up to the 128-key tile: every 128 -> 128 decode step past 128 tokens runs two
# splits and merges them (partials, a barrier, an atomic, the last split's reload). With
# N = 256 every context of up to 256 keys is one split writing its own output; longer ones
# split as before. End to end, 8B, batch 1, 128 -> 128 (contexts 128..256), 0 / 256 / 0.
source benchmarks/gpu/env.sh; R=/tmp/zzz129; mkdir -p $R
L="--load-format dummy --num-iters-warmup 2 --num-iters 5 --input-len 128 --output-len 128 --batch-size 1"
LOOM_DECODE_ONE_SPLIT_KEYS=0 lat 8b-n0 llama-3.1-8b 135
pack 8b-n0.json 8b-n0.log
LOOM_DECODE_ONE_SPLIT_KEYS=256 lat 8b-n256 llama-3.1-8b 180
pack 8b-n256.json
LOOM_DECODE_ONE_SPLIT_KEYS=0 lat 8b-n0b llama-3.1-8b 225
pack 8b-n0b.json
# Qwen3-30B-A3B (decode attention ~0.42 ms a token at these lengths), 0 / 256.
LOOM_DECODE_ONE_SPLIT_KEYS=0 lat q3-n0 qwen3-30b-a3b 400
pack q3-n0.json q3-n0.log
LOOM_DECODE_ONE_SPLIT_KEYS=256 lat q3-n256 qwen3-30b-a3b 520
pack q3-n256.json
stamp done
