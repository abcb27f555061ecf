# x2, ~60 s: TP=2 decode after the all-reduce + norm fusion moved to its own small-batch
# compile of the general graph (the 128-token prefill, avg(1), should be back near 40 ms).
source benchmarks/gpu/env.sh
R=/tmp/k; mkdir -p $R
timeout 85 $LOOM bench latency --model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 -tp 2 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3 --output-json $R/tp2-decode.json > $R/tp2.log 2>&1
grep -E "^Decode|^Prefill|all_reduce_norm_fusion" $R/tp2.log | sort | uniq -c | cut -c1-200
tar czf $OUT/k.tgz -C $R . ; stamp done
