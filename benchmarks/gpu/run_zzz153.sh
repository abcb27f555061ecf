# 1 GPU (~8 min), session 61: the end-to-end GPU tests other than the float32 matrix (run
# whole in session 60), after this session's loader changes: the embedding and LM head now
# refuse a checkpoint tensor of another shape, max_model_len is checked before the model is
# built, LoRA adapters with non-finite weights are refused at load. Real checkpoints (GGUF
# encoders, int4, int8, LoRA, fp8) load through those paths on CUDA here.
source benchmarks/gpu/env.sh; R=/tmp/zzz153; mkdir -p $R
E=tests/e2e
gpu_tests e2e 560 -vv $E/test_gpu.py -k "not float32_equals_cpu" $E/test_gpu_encoders_gguf.py \
  $E/test_gpu_int4.py $E/test_gpu_int8.py $E/test_async_engine.py
echo "$(grep -c PASSED $R/e2e.log) passed, $(grep -c -E 'FAILED|ERROR' $R/e2e.log) failed"
