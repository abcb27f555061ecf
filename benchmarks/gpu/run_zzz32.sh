# 1 GPU (~9 min cold), session 24. The device's GPU decides:
# H200: 1. norm_gemv_probe at Qwen3-30B-A3B's qkv into a copy of the tables, then Qwen3
#   decode batch 1, 128 -> 128 with that copy (tab) against the shipped tables (plain);
#   2. 8B prefill 2048 and 8192 (batch 1, level 3) with the norm op as main runs it (on:
#   loom's add + norm kernel past 8 rows) against LOOM_DECODE_NORM_GEMV=0 (Inductor's norm),
#   alternated: session 23 changed that path for prompts and did not re-measure it.
# H100: the fused MoE's table for Qwen3-30B-A3B at TP 1 and 2 (`bench moe --tune`), then
#   Qwen3 decode with it (tab) against the built-in defaults (plain).
source benchmarks/gpu/env.sh; R=$OUT/zzz32; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
mkdir -p /tmp/cfg; cp loom/kernels/configs/*.json /tmp/cfg/
D="--load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
q3_decode() {  # q3_decode DEADLINE: Qwen3 decode with /tmp/cfg (tab) and the shipped tables (plain)
  for t in tab plain; do
    dir=; [ $t = tab ] && dir=/tmp/cfg
    LOOM_MOE_CONFIG_DIR=$dir timeout $(left $1) $LOOM bench latency --model qwen3-30b-a3b $D \
      --output-json $R/q3-$t.json > $R/q3-$t.log 2>&1
    echo "q3-$t rc $?: $(grep -E '^Decode' $R/q3-$t.log | head -1 | cut -c1-150)"; stamp q3-$t
  done
}
if [ "$GPU" = NVIDIA_H200 ]; then
  NORM="gemv_norm,dtype=bfloat16,device_name=$GPU.json"
  timeout 60 python3 benchmarks/gpu/norm_gemv_probe.py $R/norm-gemv-q3.json --ms 1,2 --shapes q3_qkv \
    --write-table /tmp/cfg/$NORM > $R/norm-gemv-q3.log 2>&1
  echo "probe rc $?"; grep -E "M=|wrong|wrote|Error" $R/norm-gemv-q3.log | head; cp /tmp/cfg/$NORM $R/; stamp probe
  q3_decode 230
  P="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --output-len 1 --batch-size 1 --num-iters-warmup 3 --num-iters 10 -O 3"
  n=0
  for spec in 2048:on 2048:off 2048:on 2048:off 8192:on 8192:off; do
    len=${spec%:*}; t=${spec#*:}; n=$((n+1))
    [ $(left 560) -lt 45 ] && { echo "no time for $spec ($n)"; break; }
    v=1; [ $t = off ] && v=0
    LOOM_DECODE_NORM_GEMV=$v timeout $(left 585) $LOOM bench latency $P --input-len $len \
      --output-json $R/prefill$len-$t-$n.json > $R/prefill$len-$t-$n.log 2>&1
    echo "prefill$len-$t-$n rc $?: $(grep -E '^Prefill' $R/prefill$len-$t-$n.log | head -1 | cut -c1-180)"
    stamp prefill$len-$t-$n
  done
else
  for tp in 1 2; do
    timeout $(left 300) $LOOM bench moe --model qwen3-30b-a3b -tp $tp --tune --save-dir /tmp/cfg \
      --output-json $R/moe-tune-tp$tp.json > $R/moe-tune-tp$tp.log 2>&1
    echo "moe tune tp$tp rc $?"; grep -E "^ *M=|^ *[0-9]+ \||wrote" $R/moe-tune-tp$tp.log | cut -c1-160 | head -20; stamp moe-tp$tp
  done
  cp /tmp/cfg/E=128*"$GPU".json $R/ 2>/dev/null
  q3_decode 580
fi
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz32.tgz -C $R .
