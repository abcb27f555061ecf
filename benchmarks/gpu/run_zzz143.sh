# 1 GPU (~9 min), session 58. The GPU tests at HEAD, end to end (none ran in full since
# session 35's ac5d627 on an H200; sessions 48-54 ran chosen ones on H100s): test_gpu
# (greedy tokens equal the CPU's on a tiny llama in float32 in every graph mode, and
# transformers' in bf16), the async engine, level 3 and the piecewise graphs, the worker's
# GPU cases; then the quantized and encoder e2e files while time is left.
source benchmarks/gpu/env.sh; R=/tmp/zzz143; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name())"); echo "GPU $GPU"
t() {  # t NAME DEADLINE FILES...: the GPU-marked tests of FILES, cut off DEADLINE s in
  local name=$1 deadline=$2; shift 2
  [ $(left $deadline) -gt 20 ] || { echo "$name: no time left"; return; }
  timeout $(left $deadline) python3 -m pytest -q -m gpu -p no:cacheprovider "$@" > $R/$name.log 2>&1
  echo "$name rc $?: $(tail -1 $R/$name.log | cut -c1-160)"
  grep -E "^(FAILED|ERROR|E )" $R/$name.log | head -12 | cut -c1-220
  pack $name.log; stamp $name
}
# Session 58's first run (H100, cut at 420 s): 38 of the e2e part's 146 passed, the compile
# part ran in 31 s with the MoE warm-up test's stale count, since mended: that part first.
t compile 100 tests/compilation/test_level3.py tests/compilation/test_piece_graph.py \
  tests/worker/test_moe_warmup.py tests/worker/test_pinned.py tests/worker/test_layer_clock.py
t e2e 430 tests/e2e/test_gpu.py tests/e2e/test_async_engine.py
t quant 560 tests/e2e/test_gpu_int4.py tests/e2e/test_gpu_int8.py tests/e2e/test_gpu_encoders_gguf.py
