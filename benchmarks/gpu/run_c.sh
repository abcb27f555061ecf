# x2: the async-TP table (issue 5), then one profile of sequence parallelism forced at 2048
source benchmarks/gpu/env.sh
R=/tmp/t; mkdir -p $R
for SPEC in "8192 2" "2048 1"; do set -- $SPEC
timeout $(( 520 - ($(date +%s) - T0) )) $LOOM bench async-tp --model llama-3.1-8b -tp 2 --input-lens $1 --graphs static --impls symm_mem --whole-graph-off --repeats $2 --result-dir $R/table$1 -- --load-format dummy --no-enable-prefix-caching --max-model-len 9000 2>&1 | grep -v -E "^(INFO|DEBUG)|it/s\]|s/it\]" | tail -5
done
stamp sp-profile
LOOM_SP_MIN_TOKENS=0 timeout $(( 590 - ($(date +%s) - T0) )) $LOOM bench latency --model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 -tp 2 --input-len 2048 --output-len 1 --num-iters-warmup 3 --num-iters 5 -O '{"level":3,"compile_sizes":[2048],"pass_config":{"enable_async_tp":true}}' --profile --profile-result-dir $R/prof > $R/sp.log 2>&1; grep -E "^Avg" $R/sp.log; grep -A 25 "Profile of one" $R/sp.log | cut -c1-82,150-260
tar czf $OUT/table.tgz -C $R . ; stamp done
