# 1 GPU (~8.5 min), written in session 50 for the next session (run on whatever kind comes;
# rerun every baseline in the same call, as here).
# 1. The draft model at HEAD: run_zzz119 (H100, 37c3a3e) put the 8B with the 1B drafting 4
#    at 13.36 ms/token against 5.59 alone; 213c679 since launches a step nothing ran ahead
#    of as soon as the one before is collected. The 8B with the 1B drafting, then alone.
# 2. Where a draft-model step's last ~2.5-3.4 ms go (the 1B's four forwards explain ~4.4-5.3
#    of the 7.8 ms more than a decode): one iteration profiled with Python frames, summed
#    by trace_gaps.py (the gaps weighted by their length since ca1e290).
# 3. The decode kernel's split count inside CUDA graphs is the one of max_model_len (32
#    splits), whatever the context: Qwen3-30B-A3B int4 decode at 128 -> 128 spent 0.55 of
#    its 2.95 ms a token in `_decode_split_kernel` + `_sum_splits_kernel` (run_zzz114).
#    LOOM_DECODE_SPLITS forces the count: 2 against the default on Qwen3 int4 and on the
#    8B (one run each: rerun alternated where a difference shows). If fewer splits win at
#    short contexts, decode graphs by context bucket (or a device-side split count) is the
#    change to make.
source benchmarks/gpu/env.sh; R=/tmp/zzz120; mkdir -p $R/prof
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
L="--load-format dummy --num-iters-warmup 2 --num-iters 4 --input-len 128 --output-len 128 --batch-size 1 --temperature 0"
D4='{"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4}'
lat llama8b-draft1b llama-3.1-8b 90 --speculative-config "$D4"
lat llama8b-alone llama-3.1-8b 140
for f in llama8b-draft1b llama8b-alone; do pack $f.log $f.json; done
LOOM_TORCH_PROFILER_WITH_STACK=1 timeout $(left 220) $LOOM bench latency --model llama-3.1-8b $L \
  --num-iters 2 --output-len 64 --speculative-config "$D4" --profile \
  --profile-result-dir $R/prof > $R/draft-profile.log 2>&1
echo "profile rc $?"; grep -E "^(Decode|Speculative)" $R/draft-profile.log | cut -c1-160
timeout $(left 260) python3 benchmarks/gpu/trace_gaps.py $R/prof --top 12 > $R/gaps.txt 2>&1
cut -c1-220 $R/gaps.txt | head -60; pack draft-profile.log gaps.txt; rm -rf $R/prof
# (an empty LOOM_DECODE_SPLITS is unset; each run ends by its deadline, s after the start)
LOOM_DECODE_SPLITS= lat q3-int4-splits-default qwen3-30b-a3b-gptq-int4 370
LOOM_DECODE_SPLITS=2 lat q3-int4-splits-2 qwen3-30b-a3b-gptq-int4 450
for f in q3-int4-splits-default q3-int4-splits-2; do pack $f.log $f.json; done
LOOM_DECODE_SPLITS=2 lat llama8b-splits-2 llama-3.1-8b 510
pack llama8b-splits-2.log llama8b-splits-2.json
stamp done
