# x2: Qwen3-30B-A3B decode (GPU0) beside Qwen3-30B-A3B throughput (GPU1), then 8B prefill 8192 with a profile (GPU1)
source benchmarks/gpu/env.sh
R=/tmp/d; mkdir -p $R
( export CUDA_VISIBLE_DEVICES=0
  # Start-up compiles twice (the general graph, then the one-token graph: ~100 s + ~50 s at 07a738d)
  TORCH_LOGS=recompiles timeout 400 $LOOM bench latency --model qwen3-30b-a3b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3 --output-json $R/qwen3-decode.json > $R/qwen3-decode.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1
  # Powers of two only: 10 MoE graph captures instead of 67 (padding a decode batch costs little)
  timeout 330 $LOOM bench throughput --model qwen3-30b-a3b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O '{"level":3,"cudagraph_capture_sizes":[1,2,4,8,16,32,64,128,256]}' --output-json $R/qwen3-throughput.json > $R/qwen3-thr.log 2>&1
  timeout $(( 585 - ($(date +%s) - T0) )) $LOOM bench latency --model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --input-len 8192 --output-len 1 --num-iters-warmup 5 --num-iters 15 -O '{"level":3,"compile_sizes":[8192]}' --profile --profile-result-dir $R/prof --output-json $R/prefill8192.json > $R/prefill.log 2>&1 ) &
wait
for f in $R/*.log; do echo "== $f"; grep -E "^(Decode|Throughput|Compute floor|Prefill|Avg latency)|triggered by|- [0-9]+/[0-9]+:" $f | cut -c1-300; done
grep -A 25 "Profile of one" $R/prefill.log | cut -c1-82,150-260
tar czf $OUT/d.tgz -C $R . ; stamp done
