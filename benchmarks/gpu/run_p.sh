# x2 (~9.5 min): issue 5's table with gc.freeze() after start-up (5ebb75b), by `loom bench
# async-tp`: static graphs (compile_sizes [N]) at 8192 and 2048, off and on interleaved,
# two repeats; then the dynamic path (no compile_sizes) once more in the time left.
source benchmarks/gpu/env.sh
R=/tmp/p; mkdir -p $R
E="--load-format dummy --no-enable-prefix-caching --max-model-len 9000"
timeout 500 $LOOM bench async-tp --model llama-3.1-8b -tp 2 --input-lens 8192,2048 --graphs static --repeats 2 --result-dir $R/static -- $E > $R/static.log 2>&1
grep -E "tokens, static" $R/static.log
stamp static
LEFT=$(( 565 - ($(date +%s) - T0) ))
[ $LEFT -gt 75 ] && timeout $LEFT $LOOM bench async-tp --model llama-3.1-8b -tp 2 --input-lens 2048 --graphs dynamic --repeats 1 --result-dir $R/dyn -- $E > $R/dyn.log 2>&1
grep -E "tokens, dynamic" $R/dyn.log
tar czf $OUT/p.tgz -C $R . ; stamp done
