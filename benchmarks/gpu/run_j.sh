# x2, short: the 8192-token TP=2 prefill off and on (async TP per the table) after the
# rotary + KV-write and all-reduce + norm fusions (issue 5).
source benchmarks/gpu/env.sh
R=/tmp/j; mkdir -p $R
B="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 -tp 2 --input-len 8192 --output-len 1 --batch-size 1 --num-iters-warmup 5 --num-iters 15"
timeout 120 $LOOM bench latency $B -O '{"level":3,"compile_sizes":[8192],"cudagraph_capture_sizes":[]}' --output-json $R/off.json > $R/off.log 2>&1; grep -E "^Avg" $R/off.log
timeout 120 $LOOM bench latency $B -O '{"level":3,"compile_sizes":[8192],"cudagraph_capture_sizes":[],"pass_config":{"enable_async_tp":true}}' --output-json $R/on.json > $R/on.log 2>&1; grep -E "^Avg" $R/on.log; grep -ohE "async_tp: 8192 tokens: [^(]*" $R/on.log | sort -u
tar czf $OUT/j.tgz -C $R . ; stamp done
