# 1 GPU (~4.5 min), session 65: run_zzz161 cut to what the device time left covers. The
# GPU test of async scheduling (penalties, min_tokens run ahead, read back on events), then
# penalized against plain decode with async scheduling on and off, then 8B decode at batch
# 64 with and without a custom logits processor loaded.
source benchmarks/gpu/env.sh; R=/tmp/zzz162; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
gpu_tests gpu-async 50 tests/e2e/test_async_engine.py
for mode in on off; do
  timeout $(left $([ $mode = on ] && echo 115 || echo 180)) python3 benchmarks/gpu/penalty_runahead.py \
    $mode $R/pen-$mode.json > $R/pen-$mode.log 2>&1; echo "pen $mode rc $?"; grep "^async" $R/pen-$mode.log
  stamp pen-$mode
done
pack gpu.txt pen-on.json pen-off.json pen-on.log
L="--load-format dummy --num-iters-warmup 2 --input-len 128 --output-len 128 --num-iters 5"
P="--logits-processors tests.engine.logits_procs:TargetToken"
lat decode64 llama-3.1-8b 230 --batch-size 64
lat decode64-lp llama-3.1-8b 280 --batch-size 64 $P
pack decode64.json decode64-lp.json
stamp done
