# x2 (~9 min), session 11. run_zg measured TP=2 decode at 2.915 ms/token (default), 3.262
# (GEMV off), 2.860 (push all-reduce + cuBLASLt); the goal is 2.6. Where the 0.6 ms above
# floor + all-reduces (1.89 + 0.44) go, per step and per rank (decode_steps.py: each CUDA-graph
# replay to the next, kernels by kind, GPU idle).
# 1. TP=2 decode 128 -> 128 profiled: default, then push all-reduce + cuBLASLt.
# 2. Side by side: GPU0 1-GPU decode profiled, then prefill 8192 profiled (78% of the matmul
#    ceiling, goal 85%); GPU1 8B throughput, prompt steps 40-42 profiled, GEMV off (run_zg's
#    GPU0 run is the default beside it: 43.09 s).
source benchmarks/gpu/env.sh
R=/tmp/zi; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 110 $LOOM bench latency $D -tp 2 --profile --profile-result-dir $R/prof-tp2 --output-json $R/tp2-decode.json > $R/tp2-decode.log 2>&1
python3 benchmarks/gpu/decode_steps.py $R/prof-tp2 --json $R/tp2-decode-steps.json
LOOM_AR_NORM_PUSH=1 TORCH_BLAS_PREFER_CUBLASLT=1 timeout 100 $LOOM bench latency $D -tp 2 --profile --profile-result-dir $R/prof-tp2-push-lt --output-json $R/tp2-decode-push-lt.json > $R/tp2-decode-push-lt.log 2>&1
python3 benchmarks/gpu/decode_steps.py $R/prof-tp2-push-lt --json $R/tp2-decode-push-lt-steps.json
for f in tp2-decode tp2-decode-push-lt; do echo "$f: $(grep -E '^Decode' $R/$f.log | head -1)"; done; stamp "tp2 decode"
T="--load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
( export CUDA_VISIBLE_DEVICES=0
  timeout 100 $LOOM bench latency $D --profile --profile-result-dir $R/prof-tp1 --output-json $R/tp1-decode.json > $R/tp1-decode.log 2>&1
  python3 benchmarks/gpu/decode_steps.py $R/prof-tp1 --json $R/tp1-decode-steps.json > $R/tp1-decode-steps.txt
  timeout $(left 560) $LOOM bench latency --model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --input-len 8192 --output-len 1 --batch-size 1 --num-iters-warmup 3 --num-iters 10 -O 3 --profile --profile-result-dir $R/prof-prefill8192 --output-json $R/prefill8192.json > $R/prefill8192.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1
  LOOM_DECODE_GEMV=0 timeout $(left 560) $LOOM bench throughput --model llama-3.1-8b $T --profile-steps 40 3 --profile-result-dir $R/prof-8b-prompt-nogemv --output-json $R/thr8b-prompt-nogemv.json > $R/thr8b-prompt-nogemv.log 2>&1 ) &
wait
echo "tp1: $(grep -E '^Decode' $R/tp1-decode.log)"; cat $R/tp1-decode-steps.txt
echo "prefill8192: $(grep -E '^Prefill' $R/prefill8192.log)"; quiet < $R/prefill8192.log | grep -B2 -A22 "Self CUDA" | head -26 | cut -c1-90,160-240
f=thr8b-prompt-nogemv; echo "== $f"; grep -E "^(Throughput|Compute floor|Profile of)|^  (decode only|with prompt|steps')" $R/$f.log | cut -c1-200; grep -A14 "^Profile of" $R/$f.log | tail -11 | cut -c1-160
find $R -name 'trace-*.json' -delete
tar czf $OUT/zi.tgz -C $R . ; stamp done
