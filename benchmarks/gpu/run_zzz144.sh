# 1 GPU (~9.5 min), session 59. run_zzz143's GPU tests reordered so that one lease covers
# every feature: session 58's H100 ran 38 of the e2e part's 147 tests in file order (all
# in test_gpu_float32_equals_cpu's 16 model kinds x 8 graph modes) and was cut before the
# rest. Here: the compile/worker part (the MoE warm-up count mended in 4b35f62), then every
# e2e test outside that matrix (lone requests, bf16 vs transformers, logit options, spec
# decode, draft model, LoRA, fp8, async engine), then the matrix for three kinds (dense,
# MoE, sliding-window gemma3) in all 8 modes, then the quantized and encoder files. The
# compile part also runs the step log's CUDA-event test (session 59).
source benchmarks/gpu/env.sh; R=/tmp/zzz144; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name())"); echo "GPU $GPU"
gpu_tests compile 90 tests/compilation/test_level3.py tests/compilation/test_piece_graph.py \
  tests/worker/test_moe_warmup.py tests/worker/test_pinned.py tests/worker/test_layer_clock.py \
  tests/bench/test_step_log.py
gpu_tests features 300 tests/e2e/test_gpu.py tests/e2e/test_async_engine.py -k "not float32_equals_cpu"
gpu_tests matrix 470 tests/e2e/test_gpu.py -k "float32_equals_cpu and (llama or qwen3_moe or gemma3)"
gpu_tests quant 570 tests/e2e/test_gpu_int4.py tests/e2e/test_gpu_int8.py tests/e2e/test_gpu_encoders_gguf.py
