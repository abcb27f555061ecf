# 1 GPU (~7 min), session 65: run_zzz160 again after 3530c56, whose early read-back waited on the step being sampled (it copied the device tensor); now it waits on the earlier step's event. Requests whose sampling reads their outputs now run ahead of
# their sampled token (the driver reads it back first): the GPU tests of async scheduling
# and custom logits processors; Llama-3.1-8B decode 128 -> 128 at batch 1 and 64 with and
# without a processor loaded (run_zzz158's, before the change: +6.7% and +14.4% on H100);
# penalized against plain sampling with async scheduling on and off (off: how a penalized
# request ran before the change).
source benchmarks/gpu/env.sh; R=/tmp/zzz161; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
gpu_tests gpu-async 120 tests/e2e/test_async_engine.py tests/e2e/test_gpu_logits_processors.py
L="--load-format dummy --num-iters-warmup 2 --input-len 128 --output-len 128 --num-iters 5"
P="--logits-processors tests.engine.logits_procs:TargetToken"
lat decode llama-3.1-8b 190 --batch-size 1
lat decode-lp llama-3.1-8b 260 --batch-size 1 $P
lat decode64 llama-3.1-8b 310 --batch-size 64
lat decode64-lp llama-3.1-8b 360 --batch-size 64 $P
pack gpu.txt decode.json decode-lp.json decode64.json decode64-lp.json
for mode in on off; do
  timeout $(left 570) python3 benchmarks/gpu/penalty_runahead.py $mode $R/pen-$mode.json \
    > $R/pen-$mode.log 2>&1; echo "pen $mode rc $?"; grep "^async" $R/pen-$mode.log
  stamp pen-$mode
done
pack pen-on.json pen-off.json pen-on.log
stamp done
