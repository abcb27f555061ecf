# 1 GPU (~6 min), session 49's follow-up to run_zzz116 (H100, a795710): with Llama-3.2-1B
# drafting 4 the drafter and verify step cost ~23 ms a step beyond a plain decode, whatever
# the target (8B: 28.44 ms/token, no draft kept; the 1B for itself: 26.4 ms a step of 4.9
# tokens against its 1.3 ms decode). The first draft forward (over a step's kept tokens)
# ran eagerly; aa650fc replays it from a mixed CUDA graph. Here:
# 1. the 8B with the 1B drafting 4 again (default mode), then under -O FULL (verify steps
#    in whole-forward mixed graphs too): against run_zzz116's 28.44 ms/token and the 8B's
#    5.50 alone (rerun first, same call);
# 2. the 1B drafting for itself, one iteration under torch.profiler (device kernels) and
#    one under cProfile (host functions): where a step's time goes now.
source benchmarks/gpu/env.sh; R=$OUT/zzz117; mkdir -p $R/prof
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
L="--load-format dummy --num-iters-warmup 2 --num-iters 4 --input-len 128 --output-len 128 --batch-size 1 --temperature 0"
D4='{"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4}'
lat llama8b-alone llama-3.1-8b 90
lat llama8b-draft1b llama-3.1-8b 190 --speculative-config "$D4"
lat llama8b-draft1b-full llama-3.1-8b 300 --speculative-config "$D4" -O '{"cudagraph_mode": "FULL"}'
grep -E "draft model" $R/llama8b-draft1b.log | cut -c1-220
timeout $(left 440) $LOOM bench latency --model llama-3.2-1b $L --num-iters 2 --output-len 64 \
  --speculative-config "$D4" --profile --profile-host --profile-result-dir $R/prof \
  > $R/self-profile.log 2>&1
echo "profile rc $?"; grep -E "^(Decode|Speculative)" $R/self-profile.log | cut -c1-160
grep -A40 "^Profile of one" $R/self-profile.log | cut -c1-200
for f in $R/prof/*.txt; do [ -f "$f" ] && head -50 "$f" | cut -c1-200; done
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
