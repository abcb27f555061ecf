# 1 GPU (~5 min), session 60, on run_zzz148's warm machine: the same 13 model kinds in two
# more graph modes, level 3 as one whole graph (attention an opaque op, compile_sizes [4])
# and FULL at level 0 (whole-forward graphs of the eager model).
source benchmarks/gpu/env.sh; R=/tmp/zzz149; mkdir -p $R
gpu_tests matrix 500 tests/e2e/test_gpu.py -k "float32_equals_cpu \
  and (level3-whole-graph or level0-full) and not llama and not qwen3_moe and not gemma3"
