# 1 GPU (~6 min), session 15. What stalls the slowest steps? In run_zzm Qwen3's first
# prompt step took 2.0-2.2 s against a median of 221-233 ms, and a few more 0.4-1.1 s;
# decode steps' slowest were 4x their median. Now every Triton compile after start-up logs a
# line (loom/kernels/jit_watch.py) and the breakdown says when the first step launched:
# 1. jit_watch's GPU test;
# 2. Qwen3 throughput with the new MoE table (TMA at 4096-16384), then 8B throughput.
source benchmarks/gpu/env.sh
R=/tmp/zzn; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 60 python3 -m pytest -q -m gpu tests/kernels/test_jit_watch.py > $R/tests-jit-watch.log 2>&1
tail -2 $R/tests-jit-watch.log; stamp "jit_watch gpu test"
T="--load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
for m in qwen3-30b-a3b llama-3.1-8b; do
  timeout $(left 560) $LOOM bench throughput --model $m $T --output-json $R/thr-$m.json > $R/thr-$m.log 2>&1
  grep -E "^(Throughput|  |Compute floor)" $R/thr-$m.log | cut -c1-240
  grep -c "compiled while serving" $R/thr-$m.log; grep "compiled while serving" $R/thr-$m.log | cut -c1-300 | head -12
  stamp "$m throughput"
done
tar czf $OUT/zzn.tgz -C $R . ; stamp done
