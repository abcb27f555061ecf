# 1 GPU (~4 min), session 16. run_zzs: with no Triton compile left, every fresh prompt
# size's first one-prompt step still took ~55-60 ms more than its second (333-12011 tokens),
# and a 37-token prompt compiled the LM head's GEMV for one row. Is the former cuDNN's
# per-shape graph build on the SDPA path? 1. SDPA alone, each new length's first and second
# call per backend, and each backend's rate; 2. 8B's first steps at seven sizes, SDPA on
# (the default), then off (LOOM_SDPA_MIN_TOKENS: every prompt to loom's varlen kernel).
source benchmarks/gpu/env.sh
R=/tmp/zzt; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 120 python3 benchmarks/gpu/sdpa_shape_probe.py --json $R/sdpa-shapes.json > $R/sdpa-shapes.log 2>&1
grep -v "^INFO" $R/sdpa-shapes.log | tail -30; stamp "sdpa shapes"
for mode in sdpa kernel; do
  [ $mode = kernel ] && export LOOM_SDPA_MIN_TOKENS=1000000000
  timeout $(left 400) python3 benchmarks/gpu/step_size_probe.py --model llama-3.1-8b \
     --json $R/steps-8b-$mode.json > $R/steps-8b-$mode.log 2>&1
  grep -E "warm-up|start-up|tokens, call|compiled while" $R/steps-8b-$mode.log | cut -c1-300
  stamp "8b step sizes, $mode"
done
tar czf $OUT/zzt.tgz -C $R . ; stamp done
