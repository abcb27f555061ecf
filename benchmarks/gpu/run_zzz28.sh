# 1 GPU (~9 min cold), session 23, after run_zzz27 shipped the gemv_norm table (8B decode
# 4.115 against 4.361 ms/token). 1. the end-to-end GPU tests with the fusion now on by
# default (greedy tokens against the CPU reference and transformers), and the shipped
# fused configs at their real shapes; 2. norm_gemv_probe at
# Qwen3-30B-A3B's qkv (2048 -> 5120), merged into a copy of the table; 3. Qwen3-30B-A3B
# decode batch 1, 128 -> 128, with that copy (tab) against the shipped table (plain).
source benchmarks/gpu/env.sh; R=$OUT/zzz28; mkdir -p $R
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/e2e/test_gpu.py "tests/kernels/test_gemv_kernel.py::test_shipped_norm_configs_at_their_real_shapes" > $R/tests-e2e.log 2>&1
echo "e2e tests rc $?: $(tail -1 $R/tests-e2e.log)"; grep -E "^(FAILED|ERROR)" $R/tests-e2e.log | head -5
stamp tests
mkdir -p /tmp/cfg; cp loom/kernels/configs/*.json /tmp/cfg/
TABLE="gemv_norm,dtype=bfloat16,device_name=NVIDIA_H200.json"
timeout 100 python3 benchmarks/gpu/norm_gemv_probe.py $R/norm-gemv-q3.json --ms 1,2 --shapes q3_qkv \
  --write-table /tmp/cfg/$TABLE > $R/norm-gemv-q3.log 2>&1
echo "probe rc $?"; grep -E "M=|wrong|wrote|Error" $R/norm-gemv-q3.log | head; cp /tmp/cfg/$TABLE $R/
stamp probe
D="--load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
n=0
for t in tab plain; do
  n=$((n+1)); [ $(left 560) -lt 90 ] && { echo "no time for q3-$t"; break; }
  dir=; [ $t = tab ] && dir=/tmp/cfg
  LOOM_MOE_CONFIG_DIR=$dir timeout $(left 590) $LOOM bench latency --model qwen3-30b-a3b $D \
    --output-json $R/q3-$t-$n.json > $R/q3-$t-$n.log 2>&1
  echo "q3-$t-$n rc $?: $(grep -E '^Decode' $R/q3-$t-$n.log | head -1 | cut -c1-150)"
  grep -E "decode_gemv" $R/q3-$t-$n.log | tail -1 | cut -c60-260; stamp q3-$t-$n
done
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz28.tgz -C $R .
