# 1 GPU (~8 min), session 52.
# 1. A verify's attention alone (run_zzz126's bench, trimmed): `loom bench attention --mode
#    verify` at the 8B's heads (groups of 4) and Qwen3-30B-A3B's (groups of 8), 1 + k = 5,
#    the split-K decode kernel at q_tokens beside the varlen launch it replaced.
# 2. Each step's wall time, greedy batch 1, 128 -> 128 (spec_step_times.py): plain decodes
#    (run ahead: their period is their device time) against verify steps (nothing runs
#    ahead: device time + the host time the device waits for). Session 51 read ~3 ms a
#    step of host time off ms/token x tokens a step, counting the plain decodes before the
#    n-grams match as verify steps; this measures it. N-gram k=4, then the 1B drafting 4.
source benchmarks/gpu/env.sh; R=/tmp/zzz127; mkdir -p $R
A="--mode verify --batch-sizes 1 8 32 --context-lens 128 1024 8192 --num-iters 20 --query-len 5"
n=0
for m in llama-3.1-8b qwen3-30b-a3b; do
  n=$((n + 1))
  timeout $(left $(( 110 * n ))) $LOOM bench attention --model $m $A \
    --output-json $R/verify-$m.json > $R/verify-$m.log 2>&1
  echo "$m rc $?"; grep -E "B=|single" $R/verify-$m.log | cut -c1-170 | head -20
  pack verify-$m.log verify-$m.json; stamp verify-$m
done
NG='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
D4='{"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4}'
S="benchmarks/gpu/spec_step_times.py --model llama-3.1-8b --load-format dummy --iters 4"
timeout $(left 360) python3 $S --speculative-config "$NG" --json $R/steps-ngram.json > $R/steps-ngram.log 2>&1
echo "ngram rc $?"; grep -E "decode:|verify" $R/steps-ngram.log; stamp steps-ngram
timeout $(left 480) python3 $S --speculative-config "$D4" --json $R/steps-draft.json > $R/steps-draft.log 2>&1
echo "draft rc $?"; grep -E "decode:|verify" $R/steps-draft.log; stamp steps-draft
pack steps-ngram.log steps-ngram.json steps-draft.log steps-draft.json
stamp done
