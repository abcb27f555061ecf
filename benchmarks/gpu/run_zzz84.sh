# 1 GPU (~10 min), session 36: the GPU tests at HEAD after serving-side work (tool calls,
# reasoning, vLLM's serve flags) and the engine's new max_logprobs limit (processor, core):
# test_gpu's 20 cases, then as much of the kernel suite as the call leaves room for
# (run_zzz84b runs the rest when it does not finish).
source benchmarks/gpu/env.sh; R=$OUT/zzz84; mkdir -p $R
timeout $(left 300) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider > $R/tests-e2e.log 2>&1
echo "e2e gpu tests rc $?"; grep -E "passed|failed|FAIL|Error" $R/tests-e2e.log | tail -12; stamp e2e
timeout $(left 585) python3 -m pytest -q -m gpu tests --ignore=tests/e2e/test_gpu.py -p no:cacheprovider > $R/tests-kernels.log 2>&1
echo "kernel gpu tests rc $?"; grep -E "passed|failed|FAIL|Error" $R/tests-kernels.log | tail -12; tail -3 $R/tests-kernels.log; stamp kernel-tests
tar czf $OUT/zzz84.tgz -C $R .
