# 1 GPU (~7 min cold), session 24, last call.
# 1. the end-to-end GPU tests and every shipped gemv_norm config at its real shape (the
#    H200 table gained Qwen3-30B-A3B's qkv this session);
# 2. Qwen3-30B-A3B throughput, 1000 x 1024 -> 256, at HEAD (the standing figure is
#    739278d's, session 16).
source benchmarks/gpu/env.sh; R=$OUT/zzz35; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/e2e/test_gpu.py \
  "tests/kernels/test_gemv_kernel.py::test_shipped_norm_configs_at_their_real_shapes" > $R/tests-e2e.log 2>&1
echo "tests rc $?: $(tail -1 $R/tests-e2e.log)"; grep -E "^(FAILED|ERROR)" $R/tests-e2e.log | head -5; stamp tests
T="--model qwen3-30b-a3b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
[ $(left 540) -gt 110 ] && {
  timeout $(left 585) $LOOM bench throughput $T --output-json $R/thr-q3.json > $R/thr-q3.log 2>&1
  echo "thr-q3 rc $?"; grep -E "^(Throughput|Compute floor|  decode only|  with prompt|  steps)" $R/thr-q3.log | cut -c1-220; stamp thr-q3; }
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz35.tgz -C $R .
