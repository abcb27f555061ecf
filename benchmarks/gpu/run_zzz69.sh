# 1 GPU (~3 min), session 31 (not run: no machine was left): fast_launch, opt-in
# (LOOM_FAST_LAUNCH=1), with Triton 3.6's empty hook chains recognised (run_zzz68's never
# left Triton's path: the chains are never None). GPU tests, all with the flag on: its
# specializations against torch, the tiny llama on the GPU against the CPU (eager, default,
# PIECEWISE); then host_ab.py, before and now alternated in one process.
source benchmarks/gpu/env.sh; R=$OUT/zzz69; mkdir -p $R
LOOM_FAST_LAUNCH=1 timeout 110 python3 -m pytest -q -m gpu tests/kernels/test_fast_launch.py tests/e2e/test_gpu.py \
  -k "fast or (equals_cpu and llama and (eager or default or piecewise))" > $R/tests.log 2>&1
echo "gpu tests rc $?"; tail -3 $R/tests.log; stamp tests
timeout $(left 180) python3 benchmarks/gpu/host_ab.py 2>&1 | grep -v Warn | tee $R/host_ab.log; stamp host_ab
