# 1 GPU (~6 min), session 15. run_zzn found the slow first steps: 9 Triton compiles during
# Qwen3's throughput run (6 in 8B's), 2.6 s in all, in steps 1-5: the sampler's
# temperature-only variant and its row reduce, the decode kernel's mixed-step variants
# (request index; 128-key tiles; 1-32 splits) and their reduce kernels. The warm-up now runs
# each sampler path and every mixed-step decode variant. Also new: Python's GC pauses.
# 1. jit_watch's GPU test; 2. Qwen3 then 8B throughput: no compile while serving?
source benchmarks/gpu/env.sh
R=/tmp/zzo; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 60 python3 -m pytest -q -m gpu tests/kernels/test_jit_watch.py > $R/tests-jit-watch.log 2>&1
tail -2 $R/tests-jit-watch.log; stamp "jit_watch gpu test"
T="--load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
for m in qwen3-30b-a3b llama-3.1-8b; do
  timeout $(left 560) $LOOM bench throughput --model $m $T --output-json $R/thr-$m.json > $R/thr-$m.log 2>&1
  grep -E "warm-up:" $R/thr-$m.log | cut -c1-300
  grep -E "^(Throughput|  |Compute floor)" $R/thr-$m.log | cut -c1-240
  grep -c "compiled while serving" $R/thr-$m.log; grep "compiled while serving" $R/thr-$m.log | cut -c1-300 | head -12
  stamp "$m throughput"
done
tar czf $OUT/zzo.tgz -C $R . ; stamp done
