# 1 GPU (~7 min), session 63: the end-to-end GPU tests other than the float32 matrix, and
# sleep mode's, at the session's HEAD (utility calls and worker RPCs now carry any plain
# value; worker RPC errors come back as the call's; KV caches through `kv_zeros`).
source benchmarks/gpu/env.sh; R=/tmp/zzz155; mkdir -p $R
E=tests/e2e
gpu_tests e2e 560 -vv $E/test_gpu.py -k "not float32_equals_cpu" $E/test_gpu_encoders_gguf.py \
  $E/test_gpu_int4.py $E/test_gpu_int8.py $E/test_async_engine.py $E/test_gpu_sleep.py
echo "$(grep -c PASSED $R/e2e.log) passed, $(grep -c -E 'FAILED|ERROR' $R/e2e.log) failed"
