# 1 GPU (~3 min cold), session 25: the LL all-reduce + norm (LOOM_AR_NORM_LL=1), issue 4's
# TP=2 decode lever, on the one GPU lent.
# 1. GPU tests: the LL kernel (two ranks at once on two streams, eager and replayed), the
#    fused all-reduce + norm kernel's one-rank tests, PDL's offline compiles;
# 2. ar_norm_probe: pull, push and LL with both ranks on one GPU, one 8 KB row.
source benchmarks/gpu/env.sh; Z=${Z:-zzz37}; R=$OUT/$Z; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
timeout 200 python3 -m pytest -q tests/kernels/test_all_reduce_norm_ll.py ${TESTS-tests/kernels/test_all_reduce_norm_kernel.py tests/kernels/test_pdl.py} > $R/tests.log 2>&1
echo "tests rc $?"; tail -2 $R/tests.log; grep -E "FAILED|^E " $R/tests.log | head -12; stamp tests
[ -z "$NO_PROBE" ] && timeout 150 python3 benchmarks/gpu/ar_norm_probe.py $R/ar-norm.json > $R/ar-norm.log 2>&1
echo "probe rc $?"; quiet < $R/ar-norm.log | cut -c1-300 | tail -8; stamp probe
tar czf $OUT/$Z.tgz -C $R .
