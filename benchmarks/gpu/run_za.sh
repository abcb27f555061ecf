# x2 (~9 min), the second call of the next session, after run_z.sh.
# GPU0: `loom bench attention` (session 9, never run on a GPU): the split-K decode kernel at
#       throughput's shapes (8B, ~430 requests of ~1280 tokens a step; decode-only steps ran
#       at 1.55x their floor in run_x) against the KV-read floor, with --tune over its tiles;
#       then a mixed step (decodes beside 8192 prompt tokens): the split path against the
#       single varlen launch mixed steps took before.
#       Between them, issue 4's shape (TP=2, batch 1, 256 and 2048 tokens): does one
#       split (now one kernel, no reduce) beat the default four?
# GPU1: 8B throughput with vLLM's admission (--kv-headroom-tokens 0) beside run_z's default,
#       to tell the headroom's share from the attention split's; the default again with
#       steps 40-42 (prompt chunks beside ~500 decodes) under torch.profiler
#       (--profile-steps: where a prompt step's 1.56x goes); then Qwen3-30B-A3B throughput
#       (48.1 s = 5.48x at 3485478).
source benchmarks/gpu/env.sh
R=/tmp/za; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
( export CUDA_VISIBLE_DEVICES=0
  timeout 240 $LOOM bench attention --model llama-3.1-8b --batch-sizes 64 256 430 1024 --context-lens 1280 4096 --tune --output-json $R/attention-decode.json > $R/attention-decode.log 2>&1
  timeout 60 $LOOM bench attention --model llama-3.1-8b -tp 2 --batch-sizes 1 --context-lens 256 2048 --tune --output-json $R/attention-tp2-b1.json > $R/attention-tp2-b1.log 2>&1
  timeout $(left 470) $LOOM bench attention --model llama-3.1-8b --mode mixed --batch-sizes 256 430 --context-lens 1280 --output-json $R/attention-mixed.json > $R/attention-mixed.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 200 $LOOM bench throughput --model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --kv-headroom-tokens 0 --step-breakdown --output-json $R/throughput-8b-headroom0.json > $R/thr8b-headroom0.log 2>&1
  timeout 200 $LOOM bench throughput --model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown --profile-steps 40 3 --profile-result-dir $R/prof-mixed --output-json $R/throughput-8b-prof.json > $R/thr8b-prof.log 2>&1
  timeout $(left 560) $LOOM bench throughput --model qwen3-30b-a3b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown --output-json $R/qwen3-throughput.json > $R/qwen3-thr.log 2>&1 ) &
wait
for f in $R/attention-decode.log $R/attention-tp2-b1.log $R/attention-mixed.log; do echo "== $f"; quiet < $f | tail -25 | cut -c1-200; done
for f in $R/thr8b-headroom0.log $R/thr8b-prof.log $R/qwen3-thr.log; do echo "== $f"; grep -E "^(Throughput|Compute floor|Prompt tokens computed|Profile of)|^  (decode only|with prompt)" $f | cut -c1-220; done
grep -A25 "^Profile of" $R/thr8b-prof.log | cut -c1-200
tar czf $OUT/za.tgz -C $R . ; stamp done
