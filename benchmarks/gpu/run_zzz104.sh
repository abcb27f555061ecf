# 1 GPU (~7 min, for a budget below 10 min), session 43: run_zzz103 without its latency
# runs: the int4 / int8 tests on the GPU, loom bench w8a8 and loom bench int4 (8B shapes).
source benchmarks/gpu/env.sh; R=$OUT/zzz104; mkdir -p $R
timeout $(left 170) python3 -m pytest -q tests/kernels/test_int4_linear.py tests/kernels/test_int8_gemm.py \
  tests/kernels/test_int8_linear.py tests/e2e/test_gpu_int4.py tests/e2e/test_gpu_int8.py \
  tests/e2e/test_gpu_encoders_gguf.py \
  -p no:cacheprovider > $R/tests.log 2>&1
echo "tests rc $? $(tail -1 $R/tests.log)"; grep -E "^(FAILED|ERROR)" $R/tests.log | head -8
stamp tests
timeout $(left 300) $LOOM bench w8a8 --model llama-3.1-8b --batch-sizes 1 16 256 4096 8192 \
  --num-iters 10 --output-json $R/w8a8-kernel.json > $R/w8a8-kernel.log 2>&1
echo "bench w8a8 rc $?"; quiet < $R/w8a8-kernel.log | tail -22 | cut -c1-170
stamp w8a8
timeout $(left 400) $LOOM bench int4 --model llama-3.1-8b --batch-sizes 1 16 256 4096 --num-iters 10 \
  --output-json $R/int4-kernel.json > $R/int4-kernel.log 2>&1
echo "bench int4 rc $?"; quiet < $R/int4-kernel.log | tail -17 | cut -c1-150
stamp int4
