# x2: the serving sweep, both modes at once (GPU0 multiprocess, GPU1 inprocess), then TP=2 decode
source benchmarks/gpu/env.sh
R=/tmp/sw; mkdir -p $R
for MODE in multiprocess inprocess; do
 G=$([ $MODE = multiprocess ] && echo 0 || echo 1)
 ( CUDA_VISIBLE_DEVICES=$G timeout 480 $LOOM bench sweep --model llama-3.1-8b --rates 2,6,10,14,inf --inf-num-prompts 1000 --compute-floor --modes $MODE --duration 60 --ignore-eos --dataset-name random --random-input-len 550 --random-output-len 150 --result-dir $R/$MODE --plot -- --load-format dummy --max-model-len 2048 -O '{"level":3}' > $R/$MODE.log 2>&1 ) &
done
wait
for MODE in multiprocess inprocess; do echo "== $MODE"; grep -v -E "^(INFO|DEBUG)|it/s\]|s/it\]" $R/$MODE.log | tail -11; done
stamp tp2-decode
timeout $(( 590 - ($(date +%s) - T0) )) $LOOM bench latency --model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 -tp 2 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3 --output-json $R/tp2-decode.json > $R/tp2.log 2>&1; grep -E "^Decode|^All-reduce" $R/tp2.log
tar czf $OUT/sweep.tgz -C $R . ; stamp done
