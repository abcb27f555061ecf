# 1 GPU (~3 min cold; ~260 s of device time left), session 23, last call.
# On an H200: norm_gemv_probe at Qwen3-30B-A3B's qkv into a copy of the tables, then Qwen3
# decode batch 1, 128 -> 128 with that copy (tab) against the shipped tables (plain).
# On an H100: gemv_bench at Qwen3-30B-A3B's shapes (TP 1 and one TP=2 rank's), merged into
# the H100 plain table (no decode run: no time).
source benchmarks/gpu/env.sh; R=$OUT/zzz30; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
mkdir -p /tmp/cfg; cp loom/kernels/configs/*.json /tmp/cfg/
if [ "$GPU" = NVIDIA_H200 ]; then
  NORM="gemv_norm,dtype=bfloat16,device_name=$GPU.json"
  timeout 60 python3 benchmarks/gpu/norm_gemv_probe.py $R/norm-gemv-q3.json --ms 1,2 --shapes q3_qkv \
    --write-table /tmp/cfg/$NORM > $R/norm-gemv-q3.log 2>&1
  echo "probe rc $?"; grep -E "M=|wrong|wrote|Error" $R/norm-gemv-q3.log | head; cp /tmp/cfg/$NORM $R/; stamp probe
  D="--load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
  for t in tab plain; do
    dir=; [ $t = tab ] && dir=/tmp/cfg
    LOOM_MOE_CONFIG_DIR=$dir timeout $(left 185) $LOOM bench latency --model qwen3-30b-a3b $D \
      --output-json $R/q3-$t.json > $R/q3-$t.log 2>&1
    echo "q3-$t rc $?: $(grep -E '^Decode' $R/q3-$t.log | head -1 | cut -c1-150)"; stamp q3-$t
  done
else
  PLAIN="gemv,dtype=bfloat16,device_name=$GPU.json"
  timeout 120 python3 benchmarks/gpu/gemv_bench.py --output-json $R/gemv-q3.json --jobs 14 --budget-s 70 \
    --shapes q3_qkv,q3_o,q3_router,q3_lm_head,q3tp2_qkv,q3tp2_o,q3tp2_lm_head \
    --write-table "/tmp/cfg/$PLAIN" > $R/gemv-q3.log 2>&1
  echo "gemv q3 rc $?"; grep -h " | " $R/gemv-q3.log | cut -c1-200 | head -24; cp "/tmp/cfg/$PLAIN" $R/; stamp gemv-q3
fi
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz30.tgz -C $R .
