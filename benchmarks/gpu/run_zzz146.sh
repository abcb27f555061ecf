# 1 GPU (~5 min), session 59: what run_zzz144 left when its deadlines cut it, on the same warm
# machine: the matrix's last case and the quantized/encoder e2e files' last 15 tests.
source benchmarks/gpu/env.sh; R=/tmp/zzz146; mkdir -p $R
T="tests/e2e/test_gpu.py::test_gpu_float32_equals_cpu[level0-full-gemma3]"
for f in test_gpu_int4 test_gpu_int8 test_gpu_encoders_gguf; do
  T="$T $(python3 -m pytest --collect-only -q -m gpu tests/e2e/$f.py 2>/dev/null | grep ::)"
done
T=$(echo $T | tr ' ' '\n' | awk 'NR == 1 || NR > 7')  # run_zzz144 ran the first 6 of the 21
echo "$(echo "$T" | wc -l) tests"
timeout $(left 320) python3 -m pytest -q -m gpu -p no:cacheprovider $T > $R/rest.log 2>&1
echo "rest rc $?: $(tail -1 $R/rest.log | cut -c1-160)"
grep -E "^(FAILED|ERROR|E )" $R/rest.log | head -12 | cut -c1-220
pack rest.log; stamp done
