# 1 GPU (~8 min cold), session 23. run_zzz28 landed on an H100, for which loom ships no
# GEMV table: every decode matmul took cuBLAS, so its A/B said nothing.
# On an H100 (no table): gemv_bench measures the plain table at one TP=2 rank's and 8B's
# shapes, norm_gemv_probe the gemv_norm one (8B, the rank, Qwen3's qkv), both into a copy
# of the tables; the shipped-config GPU test runs on them; then 8B decode batch 1,
# 128 -> 128 with them (tab) against cuBLAS (plain), alternated.
# On an H200: the shipped-config GPU test; norm_gemv_probe at Qwen3's qkv into a copy;
# Qwen3-30B-A3B decode with that copy (tab) against the shipped tables (plain).
source benchmarks/gpu/env.sh; R=$OUT/zzz29; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
mkdir -p /tmp/cfg; cp loom/kernels/configs/*.json /tmp/cfg/
PLAIN="gemv,dtype=bfloat16,device_name=$GPU.json"; NORM="gemv_norm,dtype=bfloat16,device_name=$GPU.json"
if [ ! -f "loom/kernels/configs/$PLAIN" ]; then
  timeout 120 python3 benchmarks/gpu/gemv_bench.py --output-json $R/gemv-rank.json --jobs 14 --budget-s 70 \
    --write-table "/tmp/cfg/$PLAIN" > $R/gemv-rank.log 2>&1; echo "gemv rank rc $?"; stamp gemv-rank
  timeout 120 python3 benchmarks/gpu/gemv_bench.py --output-json $R/gemv-tp1.json --jobs 14 --budget-s 70 \
    --shapes qkv1,o1,gate_up1,down1,lm_head1 --write-table "/tmp/cfg/$PLAIN" > $R/gemv-tp1.log 2>&1
  echo "gemv tp1 rc $?"; stamp gemv-tp1; grep -h " | " $R/gemv-rank.log $R/gemv-tp1.log | cut -c1-200 | head -40
  shapes=8b_qkv,8b_gate_up,rank_qkv,rank_gate_up,q3_qkv; model=llama-3.1-8b; runs="tab plain tab plain"
else
  shapes=q3_qkv; model=qwen3-30b-a3b; runs="tab plain"
fi
LOOM_MOE_CONFIG_DIR=/tmp/cfg timeout 150 python3 benchmarks/gpu/norm_gemv_probe.py $R/norm-gemv.json --ms 1,2 \
  --shapes $shapes --write-table "/tmp/cfg/$NORM" > $R/norm-gemv.log 2>&1
echo "probe rc $?"; grep -E "M=|wrong|wrote|Error" $R/norm-gemv.log | head -12; cp /tmp/cfg/$PLAIN /tmp/cfg/$NORM $R/
stamp probe
LOOM_MOE_CONFIG_DIR=/tmp/cfg timeout 100 python3 -m pytest -q -p no:cacheprovider \
  "tests/kernels/test_gemv_kernel.py::test_shipped_norm_configs_at_their_real_shapes" > $R/tests.log 2>&1
echo "shipped-config tests rc $?: $(tail -1 $R/tests.log)"; grep -E "^(FAILED|ERROR)" $R/tests.log | head -5; stamp tests
D="--load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
n=0
for t in $runs; do
  n=$((n+1)); [ $(left 560) -lt 60 ] && { echo "no time for $t-$n"; break; }
  dir=; [ $t = tab ] && dir=/tmp/cfg
  LOOM_MOE_CONFIG_DIR=$dir timeout $(left 590) $LOOM bench latency --model $model $D \
    --output-json $R/$t-$n.json > $R/$t-$n.log 2>&1
  echo "$model $t-$n rc $?: $(grep -E '^Decode' $R/$t-$n.log | head -1 | cut -c1-150)"; stamp $t-$n
done
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz29.tgz -C $R .
