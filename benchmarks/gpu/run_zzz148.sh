# 1 GPU (~9.5 min), session 60. The float32-equals-CPU matrix for the 13 model kinds that
# run_zzz144 left (it ran llama, qwen3_moe and gemma3 in all 8 graph modes): each kind in
# the default mode, FULL (every step a whole-forward graph) and eager, kinds in the
# matrix's order, on a deadline so that a short lease keeps what finished.
source benchmarks/gpu/env.sh; R=/tmp/zzz148; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name())"); echo "GPU $GPU"
gpu_tests matrix 560 tests/e2e/test_gpu.py -k "float32_equals_cpu and (default or full- or eager) \
  and not level0-full and not llama and not qwen3_moe and not gemma3"
