# 1 GPU (~5 min), prepared in session 17, not yet run. run_zzz3/zzz4: in-process at 10 QPS
# (8B, 550 -> 150, --no-async) 07a738d's prompt-carrying steps took 18.4-21 ms throughout;
# this tree's ran in phases, stretches of 16-23 ms and stretches of 33-40 ms, whichever of
# the mixed-step split and FULL_AND_PIECEWISE was off. Is it the GPU (clocks, power) or the
# host? Both trees in turn with the GPU's SM clock, power and throttle reasons sampled every
# 100 ms beside each step's wall clock, this tree's per-layer host/GPU times
# (LOOM_LAYER_TIMES=1) and the allocator's cudaMalloc/cudaFree counts; the second run of
# each tree profiles five prompt steps: each kernel's GPU time per step, both trees.
# The first run of this tree is on a cold Triton cache: its warm-up line times the LM head's
# GEMV compiled on threads (6a85b4c; session 16: 16-20 s cold).
# Before the call: mkdir -p old07 && git archive 07a738d loom | tar -x -C old07
source benchmarks/gpu/env.sh
R=$OUT/zzz5; mkdir -p $R
# clocks_event_reasons (newer drivers) was clocks_throttle_reasons: whichever this one knows
REASONS=clocks_event_reasons.active
nvidia-smi --query-gpu=$REASONS --format=csv,noheader > /dev/null 2>&1 || REASONS=clocks_throttle_reasons.active
probe() {  # name dir deadline [probe flags...]
  local name=$1 dir=$2 deadline=$3 P=$PWD/benchmarks/gpu/serve_steps_probe.py; shift 3
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,$REASONS \
    --format=csv,noheader -lms 100 > $R/smi-$name.csv 2>&1 &
  local smi=$!
  (cd $dir && timeout $(left $deadline) python3 $P --seconds 12 --no-async --json $R/$name.json "$@" > $R/$name.log 2>&1)
  kill $smi
  grep -E "warm-up:|torch.compile level" $R/$name.log | cut -c1-160
  grep -E '^\{|prompt steps' $R/$name.log | cut -c1-700
  grep -A26 "^profiled" $R/$name.log; stamp "$name"
}
probe old07 old07 100
LOOM_LAYER_TIMES=1 probe head . 200
probe old07-again old07 280 --profile-prompt-steps 5
probe head-again . 360 --profile-prompt-steps 5
tar czf $OUT/zzz5.tgz -C $R . ; stamp done
timeout $(left 540) python3 -m pytest -q -m gpu tests/kernels/test_compile_pool.py 2>&1 | tail -5; stamp tests
