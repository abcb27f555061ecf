# x2: issue 8's command checked at TP=2 (the 70B shapes fit two H200s): off against async TP at 8192, static graph
source benchmarks/gpu/env.sh
R=/tmp/f; mkdir -p $R
timeout 570 $LOOM bench async-tp --model llama-3.1-70b -tp 2 --input-lens 8192 --graphs static --impls symm_mem --repeats 1 --result-dir $R/table -- --load-format dummy --no-enable-prefix-caching --max-model-len 9000 2>&1 | grep -v -E "^(INFO|DEBUG)|it/s\]|s/it\]" | tail -8
tar czf $OUT/f.tgz -C $R . ; stamp done
