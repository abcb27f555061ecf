# 1 GPU (~5.5 min), session 12. (1) 1-GPU decode at the defaults, now with the LM head's
# logits on the Triton GEMV (4.328-4.345 ms/token before). (2) Prefill 8192 profiled with
# its trace kept: its kernels take 199.5 ms but the iteration 211-230 ms (77.8% of the
# ceiling, goal 85%); trace_gaps.py says where the GPU waits (before the first kernel,
# between kernels, after the last). (3) gemm_probe.py: GEMM rates by row count, and the
# matmul rate and SM clock held for 20 s.
source benchmarks/gpu/env.sh
R=/tmp/zq; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 90 $LOOM bench latency $D --output-json $R/tp1-decode.json > $R/tp1-decode.log 2>&1
echo "tp1 decode: $(grep -E '^Decode' $R/tp1-decode.log)"; stamp "tp1 decode"
timeout 120 $LOOM bench latency --model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --input-len 8192 --output-len 1 --batch-size 1 --num-iters-warmup 3 --num-iters 10 -O 3 --profile --profile-result-dir $R/prof-prefill8192 --output-json $R/prefill8192.json > $R/prefill8192.log 2>&1
echo "prefill8192: $(grep -E '^Prefill' $R/prefill8192.log)"; grep -E "percentile" $R/prefill8192.log | head -6
python3 benchmarks/gpu/trace_gaps.py $R/prof-prefill8192 --top 15 --json $R/prefill8192-gaps.json | cut -c1-200; stamp "prefill"
timeout $(left 560) python3 benchmarks/gpu/gemm_probe.py --seconds 20 > $R/gemm-probe.log 2>&1; grep -vE "^(INFO|DEBUG)" $R/gemm-probe.log | tail -28; stamp probe
find $R -name 'trace-*.json' -size +20M -delete
tar czf $OUT/zq.tgz -C $R . ; stamp done
