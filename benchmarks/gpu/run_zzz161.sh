# 1 GPU (~7 min), session 65: run_zzz160 again after 3530c56, whose early read-back waited
# on the step being sampled (it copied the device tensor); now it waits on the earlier
# step's event. Batch 64 first, batch 1 last (cut off if time runs out).
source benchmarks/gpu/env.sh; R=/tmp/zzz161; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
gpu_tests gpu-async 60 tests/e2e/test_async_engine.py
L="--load-format dummy --num-iters-warmup 2 --input-len 128 --output-len 128 --num-iters 5"
P="--logits-processors tests.engine.logits_procs:TargetToken"
lat decode64 llama-3.1-8b 110 --batch-size 64
lat decode64-lp llama-3.1-8b 160 --batch-size 64 $P
pack gpu.txt decode64.json decode64-lp.json
for mode in on off; do
  timeout $(left $([ $mode = on ] && echo 225 || echo 290)) python3 benchmarks/gpu/penalty_runahead.py \
    $mode $R/pen-$mode.json > $R/pen-$mode.log 2>&1; echo "pen $mode rc $?"; grep "^async" $R/pen-$mode.log
  stamp pen-$mode
done
pack pen-on.json pen-off.json pen-on.log
lat decode llama-3.1-8b 350 --batch-size 1
lat decode-lp llama-3.1-8b 410 --batch-size 1 $P
pack decode.json decode-lp.json
stamp done
