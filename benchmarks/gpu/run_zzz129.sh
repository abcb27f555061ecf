# 1 GPU (~9 min), session 52. A floor on a split-K decode split's keys (cadb1db,
# LOOM_DECODE_MIN_SPLIT, off by default). Decode graphs bake 32 splits (max_model_len), and a
# split covers cdiv(keys, 32) rounded up to the 128-key tile: every 128 -> 128 decode step
# past 128 tokens runs two splits and merges them (partials, a barrier, an atomic, the last
# split's reload). With a floor of F keys a context of up to F takes one split, and one up
# to 32 F fewer splits than now.
# 1. The kernel alone (`loom bench attention --mode decode`), 8B and Qwen3-30B-A3B heads,
#    batch 1 / 8 / 32, 128..4096 keys, floor 0 (now) / 256 / 512.
# 2. End to end, batch 1, 128 -> 128 (decode graphs): 8B at 0 / 512 / 256 / 0.
source benchmarks/gpu/env.sh; R=/tmp/zzz129; mkdir -p $R
A="--mode decode --batch-sizes 1 8 32 --context-lens 128 256 512 1024 4096 --num-iters 20"
n=0
for m in llama-3.1-8b qwen3-30b-a3b; do
  for f in 0 256 512; do
    n=$((n + 1))
    LOOM_DECODE_MIN_SPLIT=$f timeout $(left $(( 35 * n + 40 ))) $LOOM bench attention --model $m $A \
      --output-json $R/attn-$m-f$f.json > $R/attn-$m-f$f.log 2>&1
    echo "$m floor $f rc $?"; grep -E "^B=" $R/attn-$m-f$f.log | cut -c1-60 | tr -s ' ' | paste -sd';' | cut -c1-400
  done
done
stamp attention
pack attn-llama-3.1-8b-f0.log attn-llama-3.1-8b-f256.log attn-llama-3.1-8b-f512.log attn-qwen3-30b-a3b-f0.log attn-qwen3-30b-a3b-f256.log attn-qwen3-30b-a3b-f512.log
tar -rf $OUT/zzz129.tar -C $R $(cd $R && ls attn-*.json)
L="--load-format dummy --num-iters-warmup 2 --num-iters 5 --input-len 128 --output-len 128 --batch-size 1"
LOOM_DECODE_MIN_SPLIT=0 lat 8b-f0 llama-3.1-8b 380
LOOM_DECODE_MIN_SPLIT=512 lat 8b-f512 llama-3.1-8b 440
LOOM_DECODE_MIN_SPLIT=256 lat 8b-f256 llama-3.1-8b 500
LOOM_DECODE_MIN_SPLIT=0 lat 8b-f0b llama-3.1-8b 560
pack 8b-f0.json 8b-f512.json 8b-f256.json 8b-f0b.json 8b-f0.log
stamp done
