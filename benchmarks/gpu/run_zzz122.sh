# 1 GPU (~8.5 min), session 51. Verify steps' attention on the split-K decode kernel (queries
# of up to 8 tokens, rows = tokens x GQA group): the varlen kernel gave a 5-token query one
# program per KV head (8 at batch 1), 13.4 us a call in run_zzz120's draft profile (49 calls
# a step). LOOM_SHORT_QUERY_DECODE=0 is the former path, alternated with the new one here.
# 1. GPU tests: the kernels' verify cases (bf16, fp8 cache) and the spec / draft e2e tests.
# 2. 8B + 1B drafting 4 (run_zzz120b: 12.79 ms/token; the 8B alone 5.49), new / old / new;
#    then the 8B alone (its decodes take the same kernel, Q_TOKENS 1).
# 3. 8B n-gram k=4 at batch 1, 128 -> 128 and 4096 -> 128 (verify over long contexts,
#    where the varlen kernel's 8 programs read every key alone), new / old each.
source benchmarks/gpu/env.sh; R=/tmp/zzz122; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
timeout $(left 110) python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_paged_attention.py \
  tests/kernels/test_kv_cache_fp8.py -k "verify" > $R/kernel-tests.log 2>&1
echo "kernel tests rc $?: $(tail -1 $R/kernel-tests.log | cut -c1-150)"; grep -E "^(FAILED|E )" $R/kernel-tests.log | head -8 | cut -c1-200
timeout $(left 200) python3 -m pytest -q -m gpu -p no:cacheprovider tests/e2e/test_gpu.py \
  -k "spec_decode or draft_model" > $R/e2e-tests.log 2>&1
echo "e2e tests rc $?: $(tail -1 $R/e2e-tests.log | cut -c1-150)"; grep -E "^(FAILED|E )" $R/e2e-tests.log | head -8 | cut -c1-200
pack kernel-tests.log e2e-tests.log; stamp tests
L="--load-format dummy --num-iters-warmup 2 --num-iters 4 --input-len 128 --output-len 128 --batch-size 1 --temperature 0"
D4='{"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4}'
NG='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
lat draft-new llama-3.1-8b 320 --speculative-config "$D4"
LOOM_SHORT_QUERY_DECODE=0 lat draft-old llama-3.1-8b 365 --speculative-config "$D4"
lat draft-new2 llama-3.1-8b 410 --speculative-config "$D4"
for f in draft-new draft-old draft-new2; do pack $f.log $f.json; done
lat alone llama-3.1-8b 440; pack alone.log alone.json
lat ngram-new llama-3.1-8b 470 --speculative-config "$NG"
LOOM_SHORT_QUERY_DECODE=0 lat ngram-old llama-3.1-8b 500 --speculative-config "$NG"
for f in ngram-new ngram-old; do pack $f.log $f.json; done
L="${L/--input-len 128/--input-len 4096} --max-model-len 4352"
lat ngram4k-new llama-3.1-8b 545 --speculative-config "$NG"
LOOM_SHORT_QUERY_DECODE=0 lat ngram4k-old llama-3.1-8b 590 --speculative-config "$NG"
for f in ngram4k-new ngram4k-old; do pack $f.log $f.json; done
stamp done
