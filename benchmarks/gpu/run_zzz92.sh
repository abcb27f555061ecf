# 1 GPU (~4 min), written in session 40 and not yet run (its LoRA part ran as run_zzz96, its
# fp8 tests in run_zzz94): the float32 GPU comparison for the model families added in
# session 39 (Qwen2-MoE, Phi-3, Gemma 2) in the default and FULL graph modes, never run on
# a GPU, and the new-model fp8 paths beside them.
source benchmarks/gpu/env.sh; R=$OUT/zzz92; mkdir -p $R
timeout $(left 260) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider \
  -k "float32_equals_cpu and (default or full) and (qwen2_moe or phi3 or gemma2)" \
  > $R/tests-gpu.log 2>&1
echo "tests rc $? $(tail -1 $R/tests-gpu.log)"; grep -E "^(FAILED|ERROR)" $R/tests-gpu.log | head -8
stamp tests
tar czf $OUT/zzz92.tgz -C $R .
