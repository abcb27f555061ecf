# 1 GPU (~4 min), session 13. The routing kernel's tests compiled on the GPU (the file has no
# gpu marker: it runs on CUDA wherever CUDA is; run_zza/zzb's `-m gpu` left it out), and
# Qwen3-MoE's float32 greedy tokens on the GPU (routing kernel, fused MoE) against the CPU.
source benchmarks/gpu/env.sh
R=/tmp/zzc; mkdir -p $R
timeout 110 python3 -m pytest -v tests/kernels/test_moe_route.py > $R/route-tests.log 2>&1; tail -3 $R/route-tests.log; stamp "route tests"
timeout 170 python3 -m pytest -v -m gpu tests/e2e/test_gpu.py -k "qwen3_moe and (eager or cuda)" > $R/e2e.log 2>&1; grep -E "PASS|FAIL|ERROR|passed|failed" $R/e2e.log | tail -5; stamp e2e
tar czf $OUT/zzc.tgz -C $R . ; stamp done
