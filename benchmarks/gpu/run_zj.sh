# 1 GPU (~4 min), session 11, when the 2-GPU kind was taken back after run_zg. A decode
# step's anatomy on one GPU (4.321 ms/token, 1.14x the weight floor): kernels by kind, the
# GPU's idle time, and one step's kernels in order with the gaps between them (how much
# each kernel boundary costs: the case for programmatic dependent launch with weight
# prefetch). Then prefill 8192 profiled (78% of the matmul ceiling, goal 85%).
source benchmarks/gpu/env.sh
R=/tmp/zj; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 100 $LOOM bench latency $D --profile --profile-result-dir $R/prof-tp1 --output-json $R/tp1-decode.json > $R/tp1-decode.log 2>&1
python3 benchmarks/gpu/decode_steps.py $R/prof-tp1 --json $R/tp1-decode-steps.json --sequence 50 > $R/tp1-decode-steps.txt
echo "tp1: $(grep -E '^Decode' $R/tp1-decode.log)"; head -32 $R/tp1-decode-steps.txt; echo ...; tail -14 $R/tp1-decode-steps.txt; stamp "tp1 decode"
timeout $(left 400) $LOOM bench latency --model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --input-len 8192 --output-len 1 --batch-size 1 --num-iters-warmup 3 --num-iters 10 -O 3 --profile --profile-result-dir $R/prof-prefill8192 --output-json $R/prefill8192.json > $R/prefill8192.log 2>&1
echo "prefill8192: $(grep -E '^Prefill' $R/prefill8192.log)"; quiet < $R/prefill8192.log | grep -A24 "Self CUDA %" | head -26 | cut -c1-90,160-240
find $R -name 'trace-*.json' -delete
tar czf $OUT/zj.tgz -C $R . ; stamp done
