# 2 GPUs (nvidia-h200-x2 or nvidia-h100-x2; ~6 min), written in session 50: the draft model
# under TP=2 on GPUs (built and tested on gloo only so far).
# 1. `test_tp2_draft_model_on_gpu`: a TP=2 target drafting for itself, the draft whole on
#    the driver or sharded (draft_tensor_parallel_size 2), gives TP=1's greedy tokens with
#    its drafts kept;
# 2. Llama-3.1-8B at TP=2, batch 1, 128 -> 128, greedy, dummy: alone, then with
#    Llama-3.2-1B drafting 4 whole on the driver and sharded. The floor of a step: the 8B's
#    half (8.03 GB) and four 1B forwards (whole: 2.47 GB each on one GPU, the other rank
#    waiting at its next collective; sharded: 1.24 GB a rank, plus 16 all-reduces each).
source benchmarks/gpu/env.sh; R=/tmp/zzz121; mkdir -p $R
nvidia-smi -L
timeout $(left 150) python3 -m pytest -q -m gpu tests/distributed/test_tp.py -p no:cacheprovider \
  -k "draft_model" > $R/gpu-tests.log 2>&1
echo "gpu tests rc $?"; tail -3 $R/gpu-tests.log | cut -c1-200; pack gpu-tests.log; stamp gpu-tests
L="--load-format dummy --num-iters-warmup 2 --num-iters 4 --input-len 128 --output-len 128 --batch-size 1 --temperature 0 -tp 2"
D='{"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4'
lat tp2-alone llama-3.1-8b 230; pack tp2-alone.log tp2-alone.json
lat tp2-draft-whole llama-3.1-8b 300 --speculative-config "$D}"
pack tp2-draft-whole.log tp2-draft-whole.json
lat tp2-draft-sharded llama-3.1-8b 370 --speculative-config "$D, \"draft_tensor_parallel_size\": 2}"
pack tp2-draft-sharded.log tp2-draft-sharded.json
