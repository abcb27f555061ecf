# 1 GPU (~5 min), session 48: the models and rotary forms added this session, on the GPU
# against the CPU (float32 greedy tokens; eager, the default and FULL graphs): Phi-4-mini's
# partial rotary embedding (the Triton backend's fused rotary kernels stand aside for it),
# Gemma (1), OLMo 2 and OLMo 3 (windowed layers at their own base, YaRN on the global ones),
# GLM-4 (partial rotary over reordered interleaved pairs), Seed-OSS (biases everywhere),
# ERNIE 4.5 (interleaved rotary pairs, reordered), EXAONE 4.0 (NoPE global layers), Arcee (ReLU-squared MLP).
source benchmarks/gpu/env.sh; R=$OUT/zzz115; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
timeout $(left 540) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider \
  -k "(eager or default or full) and not level0 and (phi3_partial or olmo or glm4 or seed_oss or ernie or exaone or arcee or (gemma and not gemma2 and not gemma3))" > $R/gpu-tests.log 2>&1
echo "gpu tests rc $?"; tail -25 $R/gpu-tests.log | cut -c1-200
stamp gpu-tests
