# 1 GPU, session 36: the kernel suite alone (run_zzz84's second half, when that call ran out).
source benchmarks/gpu/env.sh; R=$OUT/zzz84b; mkdir -p $R
timeout $(left 585) python3 -m pytest -q -m gpu tests --ignore=tests/e2e/test_gpu.py -p no:cacheprovider > $R/tests-kernels.log 2>&1
echo "kernel gpu tests rc $?"; grep -E "passed|failed|FAIL|Error" $R/tests-kernels.log | tail -12; tail -3 $R/tests-kernels.log; stamp kernel-tests
tar czf $OUT/zzz84b.tgz -C $R .
