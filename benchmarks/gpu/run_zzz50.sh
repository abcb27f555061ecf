# 1 GPU (~8 min cold), prepared in session 27 for the next one:
# 1. 8B decode at batch 1 after an 8192-token prompt: 16-bit decode attention in 128-key
#    tiles three deep (HEAD, 6135cca) against the former narrow tiles
#    (LOOM_DECODE_TILES=64,4,2), alternated, two runs each (run_zzz49 had no time for it);
# 2. decode attention over an fp8 cache at narrow batches, which still take the general
#    tiles (64 keys, 4 warps, 2 stages): the sweep's best per shape.
source benchmarks/gpu/env.sh; R=$OUT/zzz50; mkdir -p $R
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --input-len 8192 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 1 --num-iters 3 -O 3"
n=0
for t in new old new old; do
  n=$((n+1)); [ $(left 420) -lt 40 ] && { echo "no time for $t$n"; break; }
  if [ $t = old ]; then export LOOM_DECODE_TILES=64,4,2; else unset LOOM_DECODE_TILES; fi
  timeout $(left 420) $LOOM bench latency $D --output-json $R/lat8k-$t$n.json > $R/lat8k-$t$n.log 2>&1
  echo "$t$n rc $?: $(grep -E '^Decode' $R/lat8k-$t$n.log | cut -c1-150)"; stamp $t$n
done
unset LOOM_DECODE_TILES
timeout $(left 580) $LOOM bench attention --mode decode --kv-cache-dtype fp8 --batch-sizes 1 4 16 --context-lens 256 1024 4096 8192 --tune --tune-block-n 32 64 128 --tune-warps 2 4 --tune-stages 2 3 --tune-splits 8 16 32 --output-json $R/fp8-narrow.json > $R/fp8-narrow.log 2>&1
echo "fp8 narrow rc $?"; quiet < $R/fp8-narrow.log | grep -E "B=|tuned" | cut -c1-200; stamp fp8-narrow
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz50.tgz -C $R .
