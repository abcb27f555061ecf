# 1 GPU (~9 min), session 35: the GPU tests at HEAD after the three pinned rings became one
# class (loom/pinned.py; a step's input upload and a mixed step's index upload now share one
# staging ring of eight buffers): first test_gpu's ten cases that session 34 did not run
# (eager, level0-cuda-graphs, level3, level3-whole-graph, piecewise), then the kernel suite,
# which now also collects tests/entrypoints (openai imports httpx2, carried since dcda03f).
source benchmarks/gpu/env.sh; R=$OUT/zzz81; mkdir -p $R
timeout $(left 270) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider \
  -k "eager or level0-cuda-graphs or level3 or piecewise" > $R/tests-e2e.log 2>&1
echo "e2e gpu tests rc $?"; grep -E "passed|failed|FAIL|Error" $R/tests-e2e.log | tail -12; stamp e2e
timeout $(left 585) python3 -m pytest -q -m gpu tests --ignore=tests/e2e/test_gpu.py -p no:cacheprovider > $R/tests-kernels.log 2>&1
echo "kernel gpu tests rc $?"; grep -E "passed|failed|FAIL|Error" $R/tests-kernels.log | tail -12; stamp kernel-tests
tar czf $OUT/zzz81.tgz -C $R .
