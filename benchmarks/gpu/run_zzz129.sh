# 1 GPU (~4.5 min), session 52. A floor on a split-K decode split's keys (cadb1db,
# LOOM_DECODE_MIN_SPLIT, off by default). Decode graphs bake 32 splits (max_model_len), and a
# split covers cdiv(keys, 32) rounded up to the 128-key tile: every 128 -> 128 decode step
# past 128 tokens runs two splits and merges them (partials, a barrier, an atomic, the last
# split's reload). With a floor of F keys a context of up to F takes one split, and one up
# to 32 F fewer splits than now.
# 1. The kernel alone (`loom bench attention --mode decode`), 8B heads at floor 0 (now) /
#    512; batch 1 / 8 / 32, 128..4096 keys.
# 2. End to end, 8B, batch 1, 128 -> 128 (decode graphs), floor 0 / 512.
source benchmarks/gpu/env.sh; R=/tmp/zzz129; mkdir -p $R
A="--mode decode --batch-sizes 1 8 32 --context-lens 128 256 512 1024 4096 --num-iters 20"
n=0
for mf in llama-3.1-8b:0 llama-3.1-8b:512; do
  m=${mf%:*}; f=${mf#*:}; n=$((n + 1))
  LOOM_DECODE_MIN_SPLIT=$f timeout $(left $(( 28 * n + 32 ))) $LOOM bench attention --model $m $A \
    --output-json $R/attn-$m-f$f.json > $R/attn-$m-f$f.log 2>&1
  echo "$m floor $f rc $?"; grep -E "^B=" $R/attn-$m-f$f.log | cut -c1-35 | tr -s ' ' | paste -sd';'
done
stamp attention
tar -rf $OUT/zzz129.tar -C $R $(cd $R && ls attn-*)
L="--load-format dummy --num-iters-warmup 2 --num-iters 5 --input-len 128 --output-len 128 --batch-size 1"
LOOM_DECODE_MIN_SPLIT=0 lat 8b-f0 llama-3.1-8b 210
LOOM_DECODE_MIN_SPLIT=512 lat 8b-f512 llama-3.1-8b 262
pack 8b-f0.json 8b-f512.json 8b-f0.log
stamp done
