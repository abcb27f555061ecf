# 1 GPU (~9 min), session 58. The GPU tests at HEAD, end to end (none ran in full since
# session 35's ac5d627 on an H200; sessions 48-54 ran chosen ones on H100s): test_gpu
# (greedy tokens equal the CPU's on a tiny llama in float32 in every graph mode, and
# transformers' in bf16), the async engine, level 3 and the piecewise graphs, the worker's
# GPU cases; then the quantized and encoder e2e files while time is left.
source benchmarks/gpu/env.sh; R=/tmp/zzz143; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name())"); echo "GPU $GPU"
# Session 58's first run (H100, cut at 420 s): 38 of the e2e part's 146 passed, the compile
# part ran in 31 s with the MoE warm-up test's stale count, since mended: that part first.
gpu_tests compile 100 tests/compilation/test_level3.py tests/compilation/test_piece_graph.py \
  tests/worker/test_moe_warmup.py tests/worker/test_pinned.py tests/worker/test_layer_clock.py
gpu_tests e2e 430 tests/e2e/test_gpu.py tests/e2e/test_async_engine.py
gpu_tests quant 560 tests/e2e/test_gpu_int4.py tests/e2e/test_gpu_int8.py tests/e2e/test_gpu_encoders_gguf.py
