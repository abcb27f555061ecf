# 1 GPU (~5 min cold), session 27: 16-bit decode attention at narrow batches in 128-key
# tiles three deep (HEAD) against the 64-key two-stage tiles they took before
# (LOOM_DECODE_TILES=64,4,2), 8B decode at batch 1 after 128- and 8192-token prompts,
# alternated, as many as ~140 s allow (the session's last device time).
source benchmarks/gpu/env.sh; R=$OUT/zzz49; mkdir -p $R
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 1 --num-iters 3 -O 3"
for spec in 128:new 128:old 8192:new 8192:old 128:new 128:old 8192:new 8192:old; do
  len=${spec%:*}; t=${spec#*:}
  [ $(left 140) -lt 25 ] && { echo "no time for $spec"; break; }
  if [ $t = old ]; then export LOOM_DECODE_TILES=64,4,2; else unset LOOM_DECODE_TILES; fi
  f=$R/lat-$len-$t-$SECONDS
  timeout $(left 140) $LOOM bench latency $D --input-len $len --output-json $f.json > $f.log 2>&1
  echo "$spec rc $?: $(grep -E '^Decode' $f.log | cut -c1-150)"; stamp $spec
done
unset LOOM_DECODE_TILES
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz49.tgz -C $R .
