# 1 GPU (~7 min), session 20. The mixed-step split's context rule end to end: served
# 4000-token prompts -> 150 tokens at 5 QPS (8B dummy), about 5-10 decodes beside each
# prompt, every one reading 4000+ tokens. Below 16 decodes only the context rule
# (LOOM_MIXED_SPLIT_MIN_CONTEXT, default 1024) splits such a step; "oneshot" turns it off
# (one launch for every mixed step under 16 decodes), A/B/A in one call. Kernel level
# (run_zzz14): the split 2.0-3.1x as fast at 4000-token contexts. Then a smoke run of the
# split gemv_bench.py (two small shapes, short budget). Arguments: the sweeps (default
# ctx oneshot ctx-again); Dynamo's recompile reasons are logged (TORCH_LOGS=recompiles).
source benchmarks/gpu/env.sh
R=$OUT/zzz16; mkdir -p $R
O='{"level":3,"cudagraph_capture_sizes":[1,2,4,8,16,24,32,40,48,56,64]}'
deadline=0
[ $# -eq 0 ] && set -- ctx oneshot ctx-again
for name in "$@"; do
  deadline=$((deadline + 130))
  case $name in oneshot) ctx=100000000 ;; *) ctx=1024 ;; esac
  TORCH_LOGS=recompiles LOOM_MIXED_SPLIT_MIN_CONTEXT=$ctx timeout $(left $deadline) $LOOM bench sweep --model llama-3.1-8b \
    --rates 5 --modes multiprocess --duration 30 --ignore-eos --dataset-name random \
    --random-input-len 4000 --random-output-len 150 --result-dir $R/$name \
    -- --load-format dummy --max-model-len 8192 -O "$O" > $R/$name.log 2>&1
  grep -E "server side|^ +5 \|" $R/$name.log
  grep -h "compiled while serving" $R/$name/server-*.log | cut -c1-160
  grep -h -A3 "Recompiling function" $R/$name/server-*.log | cut -c1-240 | head -8; stamp "$name"
done
if [ -z "$NO_GEMV" ]; then
  timeout $(left $((deadline + 60))) python3 benchmarks/gpu/gemv_bench.py --output-json $R/gemv-smoke.json \
    --shapes q3_router,q3_o --jobs 12 --budget-s 30 > $R/gemv-smoke.log 2>&1
  echo "gemv_bench rc=$?"; tail -n 12 $R/gemv-smoke.log; stamp gemv
fi
find $R -name "server-multiprocess.log" -size +2M -delete
tar czf $OUT/zzz16.tgz -C $R . ; stamp done
