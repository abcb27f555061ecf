# 1 GPU (~7 min cold), session 28: the fp8 decode rule of <HEAD> (narrow batches: 128-key
# tiles, 4 warps, 2 stages; 2-warp wide batches split toward 1024 programs), measured:
# 1. its choice at batches 1-64 and 256-8192 tokens (default rows, no sweep);
# 2. the sweep at batches 8, 32 and 64, which run_zzz50 did not cover;
# 3. end to end: 8B decode at batch 4 after 8192-token prompts over an fp8 cache, the new
#    narrow tiles against the former ones (LOOM_DECODE_TILES=64,4,2), alternated.
source benchmarks/gpu/env.sh; R=$OUT/zzz51; mkdir -p $R
A="--mode decode --kv-cache-dtype fp8"
timeout $(left 500) $LOOM bench attention $A --batch-sizes 1 4 8 16 32 64 --context-lens 256 1024 4096 8192 --output-json $R/fp8-rule.json > $R/fp8-rule.log 2>&1
echo "rule rc $?"; quiet < $R/fp8-rule.log | grep -E "B=" | cut -c1-160; stamp rule
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --kv-cache-dtype fp8 --input-len 8192 --output-len 64 --batch-size 4 --decode-split --num-iters-warmup 1 --num-iters 3 -O 3"
n=0
for t in new old new old; do
  n=$((n+1)); [ $(left 330) -lt 60 ] && { echo "no time for $t$n"; break; }
  if [ $t = old ]; then export LOOM_DECODE_TILES=64,4,2; else unset LOOM_DECODE_TILES; fi
  timeout $(left 330) $LOOM bench latency $D --output-json $R/lat-$t$n.json > $R/lat-$t$n.log 2>&1
  echo "$t$n rc $?: $(grep -E '^Decode' $R/lat-$t$n.log | cut -c1-150)"; stamp $t$n
done
unset LOOM_DECODE_TILES
timeout $(left 560) $LOOM bench attention $A --batch-sizes 8 32 64 --context-lens 1024 4096 8192 --tune --tune-block-n 64 128 --tune-warps 2 4 --tune-stages 2 3 --tune-splits 1 2 4 8 16 --output-json $R/fp8-sweep.json > $R/fp8-sweep.log 2>&1
echo "sweep rc $?"; quiet < $R/fp8-sweep.log | grep -E "B=|tuned" | cut -c1-200; stamp sweep
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz51.tgz -C $R .
