# x2 (~9.5 min): issue 5's 8192 row with loom's p2p ops beside PyTorch's (run after run_r
# has shown p2p's tokens equal TP=1's): off, symm_mem, p2p interleaved, two repeats; then
# 2048 static off/on once more (the same kernels either way; with LOOM_LAYER_TIMES lines).
source benchmarks/gpu/env.sh
R=/tmp/s; mkdir -p $R
E="--load-format dummy --no-enable-prefix-caching --max-model-len 9000"
timeout 440 $LOOM bench async-tp --model llama-3.1-8b -tp 2 --input-lens 8192 --graphs static --impls symm_mem,p2p --repeats 2 --result-dir $R/s8192 -- $E > $R/s8192.log 2>&1
grep -E "tokens, static" $R/s8192.log
stamp 8192
LEFT=$(( 565 - ($(date +%s) - T0) ))
[ $LEFT -gt 100 ] && LOOM_LAYER_TIMES=1 timeout $LEFT $LOOM bench async-tp --model llama-3.1-8b -tp 2 --input-lens 2048 --graphs static --repeats 1 --result-dir $R/s2048 -- $E > $R/s2048.log 2>&1
grep -E "tokens, static" $R/s2048.log
tar czf $OUT/s.tgz -C $R . ; stamp done
