# 1 GPU (~5.5 min), session 50, after run_zzz118 (H100, ba2cb32: 8B + 1B drafting 4 at 13.63
# ms/token in the default mode; the 1B drafting for itself at 1.920 ms/token, ~9.5 ms a
# step of ~6.5 ms of kernels). f1f4d78 queues the drafter's forwards behind each step's
# kernels before the read-back (vLLM's padded drafter batch), their positions and slots
# computed on the device. Here: the 8B with the 1B drafting 4, then the 8B alone (its
# baseline, same call); the 1B drafting for itself, then alone; the GPU draft-model test
# (default, FULL, and no graphs: the eager one-token forwards from device-only metadata).
source benchmarks/gpu/env.sh; R=/tmp/zzz119; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
L="--load-format dummy --num-iters-warmup 2 --num-iters 4 --input-len 128 --output-len 128 --batch-size 1 --temperature 0"
D4='{"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4}'
lat llama8b-draft1b llama-3.1-8b 100 --speculative-config "$D4"
pack llama8b-draft1b.log llama8b-draft1b.json
lat llama8b-alone llama-3.1-8b 165; pack llama8b-alone.log llama8b-alone.json
lat llama1b-self llama-3.2-1b 210 --speculative-config "$D4"; pack llama1b-self.log llama1b-self.json
lat llama1b-alone llama-3.2-1b 245; pack llama1b-alone.log llama1b-alone.json
timeout $(left 320) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider \
  -k "draft_model" > $R/gpu-tests.log 2>&1
echo "gpu tests rc $?"; tail -3 $R/gpu-tests.log | cut -c1-200; grep -E "^(FAILED|E )" $R/gpu-tests.log | head -20 | cut -c1-200
pack gpu-tests.log; stamp gpu-tests
