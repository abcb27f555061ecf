# 1 GPU (~5 min cold), session 21: run_zzz22's 8B decode read 4.358 ms/token against 4.279 in
# run_zzz20/21 (other calls, other hosts). An A/B in one call: this tree (new) against
# 3fdcb09 (old, before the audit fixes; carried as ./oldtree, run from its own cwd),
# alternated new/old/new/old, batch-1 decode 128 -> 128 at level 3.
source benchmarks/gpu/env.sh; R=$OUT/zzz23; mkdir -p $R
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
n=0
for tree in new old new old; do
  n=$((n+1)); dir=$PWD; c=$LOOM_GIT_COMMIT; [ $tree = old ] && dir=$PWD/oldtree && c=3fdcb09
  (cd $dir && LOOM_GIT_COMMIT=$c PYTHONPATH=/tmp/site:$dir timeout $(left $((n * 140))) python3 -m loom.cli bench latency $D \
    --output-json $R/$tree-$n.json > $R/$tree-$n.log 2>&1)
  echo "$tree-$n rc $?: $(grep -E '^Decode' $R/$tree-$n.log | head -1 | cut -c1-150)"
done
tar czf $OUT/zzz23.tgz -C $R .
