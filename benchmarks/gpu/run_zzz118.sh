# 1 GPU (~5.5 min), session 50: after run_zzz117 (H100, 5e95751) put the 8B + 1B drafting 4 at
# 16.02 ms/token in the default mode and 13.88 under FULL (8B alone 5.49), and the 1B
# drafting for itself at ~20 ms a step whose kernels took 6.6 ms (the verify step's pieces,
# launched from Python with eager attention, took ~7 ms of host a step):
# - 6dcc3bf: verify steps replay whole-forward graphs in the default mode too (vLLM's
#   uniform-decode full graphs);
# - 722314e: no pageable copy waiting on the feed forward inside the drafter.
# Here, each against its floor: 8B alone; 8B + 1B default; the 1B drafting for itself
# profiled with Python frames (trace_gaps.py sums the GPU's idle time by loom frame); the GPU
# draft-model test (the verify graphs' tokens). Logs and JSON go into $OUT/zzz118.tar one
# run at a time (at most 8 files come back).
source benchmarks/gpu/env.sh; R=/tmp/zzz118; mkdir -p $R/prof
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
L="--load-format dummy --num-iters-warmup 2 --num-iters 4 --input-len 128 --output-len 128 --batch-size 1 --temperature 0"
D4='{"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4}'
lat llama8b-alone llama-3.1-8b 75; pack llama8b-alone.log llama8b-alone.json
lat llama8b-draft1b llama-3.1-8b 160 --speculative-config "$D4"
grep -E "captured|draft model" $R/llama8b-draft1b.log | cut -c1-200
pack llama8b-draft1b.log llama8b-draft1b.json
LOOM_TORCH_PROFILER_WITH_STACK=1 timeout $(left 250) $LOOM bench latency --model llama-3.2-1b $L \
  --num-iters 2 --output-len 64 --speculative-config "$D4" --profile \
  --profile-result-dir $R/prof > $R/self-profile.log 2>&1
echo "profile rc $?"; grep -E "^(Decode|Speculative)" $R/self-profile.log | cut -c1-160
timeout $(left 290) python3 benchmarks/gpu/trace_gaps.py $R/prof --top 15 > $R/gaps.txt 2>&1
cut -c1-220 $R/gaps.txt; cp $R/gaps.txt $OUT/; pack self-profile.log gaps.txt
timeout $(left 330) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider \
  -k "draft_model" > $R/gpu-tests.log 2>&1
echo "gpu tests rc $?"; tail -3 $R/gpu-tests.log | cut -c1-200; pack gpu-tests.log
stamp gpu-tests
