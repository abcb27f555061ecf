# 1 GPU (~4 min), session 51: where an n-gram verify step's time goes. run_zzz122 (H100,
# f169937): 8B n-gram k=4 at batch 1, 128 -> 128, 2.263 ms/token at 4.14 tokens a step,
# ~9.4 ms a step against the 8B's decode at 5.58 ms/token: ~3.8 ms more a step (session 37
# saw ~2.7 on an H200). One iteration of 64 tokens profiled with Python frames, then
# trace_gaps.py (the GPU's idle time by the host's loom frames).
source benchmarks/gpu/env.sh; R=/tmp/zzz125; mkdir -p $R/prof
NG='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
LOOM_TORCH_PROFILER_WITH_STACK=1 timeout $(left 170) $LOOM bench latency --model llama-3.1-8b \
  --load-format dummy --num-iters-warmup 2 --num-iters 2 --input-len 128 --output-len 64 \
  --batch-size 1 --temperature 0 --speculative-config "$NG" --profile \
  --profile-result-dir $R/prof > $R/ngram-profile.log 2>&1
echo "profile rc $?"; grep -E "^(Decode|Speculative)" $R/ngram-profile.log | cut -c1-160
pack ngram-profile.log
timeout $(left 215) python3 benchmarks/gpu/trace_gaps.py $R/prof --top 12 > $R/gaps.txt 2>&1
cut -c1-200 $R/gaps.txt | head -45; pack gaps.txt; stamp done
