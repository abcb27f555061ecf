# 1 GPU (~8 min cold), session 24. The fused MoE's GEMV kernels in persistent form
# (PERSISTENT = tiles a program): each program pays its expert-id load and pipeline fill
# once for several tiles instead of once per tile.
# 1. the fused MoE's GPU tests (persistent config included);
# 2. moe_gemv_probe: the per-tile kernels (main, tuned) against a persistent grid at Qwen3's
#    TP 1 and TP 2 shapes, 1 and 2 tokens; the best persistent pair goes into a copy of the
#    tables where it beats main by > 3%;
# 3. Qwen3 decode batch 1, 128 -> 128 with that copy (tab) against the shipped (plain),
#    alternated, twice each if time allows.
source benchmarks/gpu/env.sh; R=$OUT/zzz33; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_fused_moe.py -k "gpu" > $R/tests-moe.log 2>&1
echo "moe gpu tests rc $?: $(tail -1 $R/tests-moe.log)"; grep -E "^(FAILED|ERROR)" $R/tests-moe.log | head -5; stamp tests
mkdir -p /tmp/cfg; cp loom/kernels/configs/*.json /tmp/cfg/
timeout 240 python3 benchmarks/gpu/moe_gemv_probe.py $R/moe-gemv-probe.json --write-table /tmp/cfg > $R/moe-gemv-probe.log 2>&1
echo "probe rc $?"; grep -E "^==|main|best|dense|wrote|WRONG|Error" $R/moe-gemv-probe.log | cut -c1-230 | head -40
cp /tmp/cfg/E=128*.json $R/ 2>/dev/null; stamp probe
D="--load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
n=0
for t in tab plain tab plain; do
  n=$((n+1)); [ $(left 570) -lt 65 ] && { echo "no time for q3-$t-$n"; break; }
  dir=; [ $t = tab ] && dir=/tmp/cfg
  LOOM_MOE_CONFIG_DIR=$dir timeout $(left 590) $LOOM bench latency --model qwen3-30b-a3b $D \
    --output-json $R/q3-$t-$n.json > $R/q3-$t-$n.log 2>&1
  echo "q3-$t-$n rc $?: $(grep -E '^Decode' $R/q3-$t-$n.log | head -1 | cut -c1-150)"; stamp q3-$t-$n
done
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz33.tgz -C $R .
