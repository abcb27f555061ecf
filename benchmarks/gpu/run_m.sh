# x2, issue 3 (~9.5 min): where the 8B throughput run's time goes, and the 1-GPU prefill
# targets re-measured, on GPU0; Qwen3-30B-A3B decode and throughput (never recorded yet) on GPU1.
source benchmarks/gpu/env.sh
R=/tmp/m; mkdir -p $R
( export CUDA_VISIBLE_DEVICES=0
  timeout 200 $LOOM bench throughput --model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown --output-json $R/throughput-8b.json > $R/thr8b.log 2>&1
  for N in 8192 2048; do
    timeout 150 $LOOM bench latency --model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --input-len $N --output-len 1 --num-iters-warmup 5 --num-iters 15 -O "{\"level\":3,\"compile_sizes\":[$N]}" --output-json $R/prefill$N.json > $R/prefill$N.log 2>&1
  done ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 330 $LOOM bench latency --model qwen3-30b-a3b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3 --output-json $R/qwen3-decode.json > $R/qwen3-decode.log 2>&1
  timeout $(( 575 - ($(date +%s) - T0) )) $LOOM bench throughput --model qwen3-30b-a3b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O '{"level":3,"cudagraph_capture_sizes":[1,2,4,8,16,32,64,128,256]}' --step-breakdown --output-json $R/qwen3-throughput.json > $R/qwen3-thr.log 2>&1 ) &
wait
for f in $R/*.log; do echo "== $f"; grep -E "^(Decode|Throughput|Compute floor|Prefill|Avg latency)|^  (decode only|with prompt)" $f | cut -c1-260; done
tar czf $OUT/m.tgz -C $R . ; stamp done
