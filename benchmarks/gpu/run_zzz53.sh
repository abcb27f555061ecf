# 1 GPU (~3 min cold), session 28: why run_zzz52's batch-16 fp8 decode was as fast end to
# end with 3 splits as with 8 when the kernel bench put 8 ahead: one profiled iteration
# each (16 output tokens), the decode kernel's device time from the ops table.
source benchmarks/gpu/env.sh; R=$OUT/zzz53; mkdir -p $R
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 4200 --kv-cache-dtype fp8 --input-len 4096 --output-len 16 --batch-size 16 --num-iters-warmup 1 --num-iters 1 -O 3 --profile"
for t in new old; do
  [ $(left 200) -lt 40 ] && { echo "no time for $t"; break; }
  if [ $t = old ]; then export LOOM_DECODE_SPLITS=3; else unset LOOM_DECODE_SPLITS; fi
  timeout $(left 200) $LOOM bench latency $D --profile-result-dir $R/prof-$t > $R/prof-$t.log 2>&1
  echo "$t rc $?"; quiet < $R/prof-$t.log | grep -iE "decode_split|_kernel|Self CUDA|Name" | head -14 | cut -c1-200; stamp $t
  rm -rf $R/prof-$t
done
tar czf $OUT/zzz53.tgz -C $R .
