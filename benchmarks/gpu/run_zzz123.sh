# 1 GPU (~7 min), session 51, after run_zzz122 (H100, f169937: verify queries on the split-K
# decode kernel; n-gram k=4 at batch 1 after 4096 tokens 8.49 against 11.60 ms a step, after
# 128 tokens 7.11 against 7.17; 8B + 1B drafting 4 at 13.06 / 12.99 against 13.17 ms/token).
# New / old (LOOM_SHORT_QUERY_DECODE=0) each:
# 1. n-gram k=4 at batch 8, 128 -> 128 (verify graphs of 8 requests' 40 tokens: the packed
#    varlen launch had 64 programs there, and the split count is chosen for 8 requests);
# 2. 8B + 1B drafting 4 after 4096 tokens (both the verify and the drafter's first forward);
# 3. Qwen3-30B-A3B GPTQ-Int4 with n-gram k=4 (groups of 8: 64-row tiles).
source benchmarks/gpu/env.sh; R=/tmp/zzz123; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
B="--load-format dummy --num-iters-warmup 2 --num-iters 4 --output-len 128 --temperature 0"
D4='{"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4}'
NG='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
L="$B --input-len 128 --batch-size 8"
lat ngram-b8-new llama-3.1-8b 110 --speculative-config "$NG"
LOOM_SHORT_QUERY_DECODE=0 lat ngram-b8-old llama-3.1-8b 145 --speculative-config "$NG"
for f in ngram-b8-new ngram-b8-old; do pack $f.log $f.json; done
L="$B --input-len 4096 --batch-size 1 --max-model-len 4352"
lat draft4k-new llama-3.1-8b 215 --speculative-config "$D4"
LOOM_SHORT_QUERY_DECODE=0 lat draft4k-old llama-3.1-8b 280 --speculative-config "$D4"
for f in draft4k-new draft4k-old; do pack $f.log $f.json; done
L="$B --input-len 128 --batch-size 1"
lat q3-ngram-new qwen3-30b-a3b-gptq-int4 380 --speculative-config "$NG"
LOOM_SHORT_QUERY_DECODE=0 lat q3-ngram-old qwen3-30b-a3b-gptq-int4 450 --speculative-config "$NG"
for f in q3-ngram-new q3-ngram-old; do pack $f.log $f.json; done
stamp done
