# 1 GPU (~7 min), session 60: the float32 matrix's last 39 cases at this loom/, the 13 model
# kinds of run_zzz148/149 under level0-cuda-graphs, level3 and piecewise.
source benchmarks/gpu/env.sh; R=/tmp/zzz150; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name())"); echo "GPU $GPU"
gpu_tests matrix 540 tests/e2e/test_gpu.py -k "float32_equals_cpu \
  and (level0-cuda-graphs or level3- or piecewise) and not level3-whole-graph \
  and not llama and not qwen3_moe and not gemma3"
