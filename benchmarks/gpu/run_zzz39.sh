# 1 GPU (~4 min cold), session 26: TP=2 decode's all-reduce inside the GEMVs around it.
# 1. GPU tests: the LL GEMVs (two ranks at once on two streams, eager and replayed), the
#    GEMV's and the LL all-reduce + norm kernel's own tests, PDL's compiles;
# 2. ll_gemv_probe: kernel / fused / apart chains, both ranks on one GPU, rank shapes;
# 3. overlap_probe again, now with the ceilings in its JSON.
source benchmarks/gpu/env.sh; R=$OUT/zzz39; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
timeout 240 python3 -m pytest -q tests/kernels/test_gemv_ll.py tests/kernels/test_all_reduce_norm_ll.py tests/kernels/test_gemv_kernel.py tests/kernels/test_pdl.py > $R/tests.log 2>&1
echo "tests rc $?"; tail -2 $R/tests.log; grep -E "FAILED|^E " $R/tests.log | head -12; stamp tests
timeout 200 python3 benchmarks/gpu/ll_gemv_probe.py $R/ll-gemv.json > $R/ll-gemv.log 2>&1
echo "ll probe rc $?"; quiet < $R/ll-gemv.log | cut -c1-300 | tail -10; stamp ll-probe
timeout 100 python3 benchmarks/gpu/overlap_probe.py $R/overlap.json > $R/overlap.log 2>&1
echo "overlap probe rc $?"; quiet < $R/overlap.log | cut -c1-200 | tail -10; stamp overlap
tar czf $OUT/zzz39.tgz -C $R .
