# 1 GPU (~5 min cold), session 28: the fp8 decode splits of <HEAD> (2-warp tiles toward
# 1024 programs, at most 8 splits), measured:
# 1. at 8-64 requests, each split count of the 2-warp tile timed alike (the sweep's list);
# 2. end to end: 8B decode at batch 16 after 4096-token prompts over an fp8 cache, the
#    new 8 splits against the former 3 (LOOM_DECODE_SPLITS=3), alternated.
source benchmarks/gpu/env.sh; R=$OUT/zzz52; mkdir -p $R
timeout $(left 200) $LOOM bench attention --mode decode --kv-cache-dtype fp8 --batch-sizes 8 16 32 64 --context-lens 1024 4096 8192 --tune --tune-block-n 64 --tune-warps 2 --tune-stages 3 --tune-splits 1 2 3 4 8 16 --output-json $R/fp8-splits.json > $R/fp8-splits.log 2>&1
echo "splits rc $?"; quiet < $R/fp8-splits.log | grep -E "B=|tuned" | cut -c1-200; stamp splits
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 4200 --kv-cache-dtype fp8 --input-len 4096 --output-len 64 --batch-size 16 --decode-split --num-iters-warmup 1 --num-iters 3 -O 3"
n=0
for t in new old new old; do
  n=$((n+1)); [ $(left 420) -lt 60 ] && { echo "no time for $t$n"; break; }
  if [ $t = old ]; then export LOOM_DECODE_SPLITS=3; else unset LOOM_DECODE_SPLITS; fi
  timeout $(left 420) $LOOM bench latency $D --output-json $R/lat-$t$n.json > $R/lat-$t$n.log 2>&1
  echo "$t$n rc $?: $(grep -E '^Decode' $R/lat-$t$n.log | cut -c1-150)"; grep -E "every decode takes" $R/lat-$t$n.log | head -1 | cut -c1-160; stamp $t$n
done
unset LOOM_DECODE_SPLITS
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz52.tgz -C $R .
