# 1 GPU, the session's last ~100 s, session 28: run_zzz53's question, eager (no compile,
# no graphs) to fit: the engine's fp8 decode kernel (fused rotary + KV write, PDL) at batch
# 16 after 4096-token prompts, 8 splits against 3, its device time from the ops table.
source benchmarks/gpu/env.sh; R=$OUT/zzz54; mkdir -p $R
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 4200 --kv-cache-dtype fp8 --input-len 4096 --output-len 8 --batch-size 16 --num-iters-warmup 0 --num-iters 1 --enforce-eager --profile"
for t in new old; do
  if [ $t = old ]; then export LOOM_DECODE_SPLITS=3; else unset LOOM_DECODE_SPLITS; fi
  timeout $(left 95) $LOOM bench latency $D --profile-result-dir $R/prof-$t > $R/prof-$t.log 2>&1
  echo "$t rc $?"; grep -E "decode_split|Name" $R/prof-$t.log | head -4 | cut -c1-220; stamp $t
  rm -rf $R/prof-$t
done
tar czf $OUT/zzz54.tgz -C $R .
