# x2 (~5 min; 392 s of device time were left), issues 3 and 4 after run_m/run_w, side by side:
#  GPU0: 8B throughput with the new batch defaults (1024 requests, 16384 tokens a step) and
#        FULL_AND_PIECEWISE now the default; then the Triton GEMV against cuBLAS at TP=2
#        per-rank decode shapes (benchmarks/gpu/gemv_bench.py).
#  GPU1: Qwen3-30B-A3B throughput with the fused MoE as one opaque op (no recompiles) and
#        its tuned tile table; then its decode, batch 1.
source benchmarks/gpu/env.sh
R=/tmp/x; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
( export CUDA_VISIBLE_DEVICES=0
  timeout 180 $LOOM bench throughput --model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown --output-json $R/throughput-8b.json > $R/thr8b.log 2>&1
  timeout $(left 285) python3 benchmarks/gpu/gemv_bench.py --output-json $R/gemv.json --jobs 12 --budget-s 70 > $R/gemv.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 200 $LOOM bench throughput --model qwen3-30b-a3b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown --output-json $R/qwen3-throughput.json > $R/qwen3-thr.log 2>&1
  timeout $(left 285) $LOOM bench latency --model qwen3-30b-a3b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3 --output-json $R/qwen3-decode.json > $R/qwen3-decode.log 2>&1 ) &
wait
for f in $R/*.log; do echo "== $f"; grep -E "^(Decode|Throughput|Compute floor|Prefill|Avg latency)|^  (decode only|with prompt)|batches: up to|Traceback|Error" $f | cut -c1-250 | head -12; done
grep -E "^(qkv|o_proj|gate_up|down|lm_head)|copy|M=" $R/gemv.log | cut -c1-200 | head -30
tar czf $OUT/x.tgz -C $R . ; stamp done
