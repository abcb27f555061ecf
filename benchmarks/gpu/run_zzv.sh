# 1 GPU (~5 min), session 16. run_zzu's serving half failed to start: fastapi 0.165 imports
# opentelemetry (now among the wheels). Its step-size probe compiled the rotary kernel's
# keys-out variant at the first 3001-token prompt: the warm-up now also runs a fresh prompt
# through SDPA. 1. 8B's first steps at seven sizes; 2. serving at 2 and 10 QPS, 550 -> 150
# tokens: SDPA for every prompt (LOOM_SDPA_MIN_TOKENS=0, the former default), then the new one.
source benchmarks/gpu/env.sh
R=/tmp/zzv; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 150 python3 benchmarks/gpu/step_size_probe.py --model llama-3.1-8b --json $R/steps-8b.json > $R/steps-8b.log 2>&1
grep -E "warm-up|start-up|tokens, call|compiled while" $R/steps-8b.log | cut -c1-300; stamp "8b step sizes"
for mode in sdpa0 default; do
  [ $mode = sdpa0 ] && export LOOM_SDPA_MIN_TOKENS=0 || unset LOOM_SDPA_MIN_TOKENS
  timeout $(left 560) $LOOM bench sweep --model llama-3.1-8b --rates 2,10 --modes multiprocess --duration 30 --ignore-eos \
    --dataset-name random --random-input-len 550 --random-output-len 150 --result-dir $R/serve-$mode \
    -- --load-format dummy --max-model-len 2048 -O '{"level":3}' > $R/serve-$mode.log 2>&1
  grep -v -E "^(INFO|DEBUG)|it/s\]|s/it\]" $R/serve-$mode.log | tail -5
  grep -h "compiled while serving" $R/serve-$mode/*.log | cut -c1-250 | head -5; stamp "serve, $mode"
done
tar czf $OUT/zzv.tgz -C $R . ; stamp done
