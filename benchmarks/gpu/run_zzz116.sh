# 1 GPU (~6 min), session 49: speculative decoding with a draft model (loom/worker/drafter.py,
# built this session on the CPU). The drafter runs its model eagerly after each step's
# tokens are read back: one forward over the kept tokens, then k - 1 one-token forwards.
# 1. the GPU test: a draft that is the target itself, on the device beside the target's
#    graphs (default and FULL), gives the CPU's tokens with its drafts accepted;
# 2. Llama-3.1-8B, batch 1, 128 -> 128, greedy: alone, then with Llama-3.2-1B (dummy, so
#    its drafts are nearly all rejected) drafting 4: the step's cost with drafts, from which
#    the acceptance a real pair needs to gain follows;
# 3. Llama-3.2-1B alone, then drafting for itself (every draft accepted): the mechanism's
#    best case, and the eager drafter's cost beside a graph-replayed target.
source benchmarks/gpu/env.sh; R=$OUT/zzz116; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
timeout $(left 120) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider \
  -k "draft_model" > $R/gpu-tests.log 2>&1
echo "gpu tests rc $?"; tail -6 $R/gpu-tests.log | cut -c1-200
stamp gpu-tests
L="--load-format dummy --num-iters-warmup 2 --num-iters 4 --input-len 128 --output-len 128 --batch-size 1 --temperature 0"
D4='{"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4}'
lat llama8b-alone llama-3.1-8b 200
lat llama8b-draft1b llama-3.1-8b 290 --speculative-config "$D4"
lat llama1b-alone llama-3.2-1b 330
lat llama1b-self llama-3.2-1b 380 --speculative-config "$D4"
grep -E "draft model|speculative" $R/llama8b-draft1b.log | head -4 | cut -c1-200
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
