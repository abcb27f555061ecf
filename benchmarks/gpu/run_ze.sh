# 1 GPU (~9.5 min), session 10's fourth call: the GEMV on by default (run_zd: 1-GPU decode
# 4.591 -> 4.298 ms), its activation kernel past 8 rows, and the prefill kernel's tuned
# tiles (128 x 64, 4 warps, 3 stages: 1.11x / 1.24x at throughput's prompt steps).
# 1. GPU tests: paged attention (new prefill tiles), the GEMV kernels (the SiLU·mul kernel).
# 2. 1-GPU decode at the defaults (GEMV on).
# 3. 8B throughput at the defaults (41.11 s in run_zd).
# 4. 8192-token prefill at the defaults and with LOOM_DECODE_GEMV=0 (does the opaque linear op
#    in the general graph cost prefill anything? 84.3% of the ceiling at 6528cc9).
# 5. Qwen3-30B-A3B decode (6.665 ms at 3485478, eager align) and throughput (48.1 s).
source benchmarks/gpu/env.sh
R=/tmp/ze; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout -s INT 70 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short -m "gpu or not slow" tests/kernels/test_paged_attention.py tests/kernels/test_gemv_kernel.py > $R/tests.log 2>&1; echo "rc=$?" >> $R/tests.log
grep -E "^(FAILED|ERROR|E  )|passed|failed|rc=" $R/tests.log | tail -8; stamp tests
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 80 $LOOM bench latency $D --output-json $R/tp1-decode.json > $R/tp1-decode.log 2>&1
echo "tp1 decode: $(grep -E '^Decode' $R/tp1-decode.log | head -1)"; stamp "tp1 decode"
timeout 150 $LOOM bench throughput --model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown --output-json $R/throughput-8b.json > $R/thr8b.log 2>&1
grep -E "^(Throughput|Compute floor|Prompt tokens computed)|^  (decode only|with prompt|steps')" $R/thr8b.log | cut -c1-250; tail -2 $R/thr8b.log | cut -c1-200; stamp "throughput"
P="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --output-len 1 --batch-size 1 --num-iters-warmup 5 --num-iters 15 --input-len 8192 -O 3"
timeout 75 $LOOM bench latency $P --output-json $R/prefill8192.json > $R/prefill8192.log 2>&1
LOOM_DECODE_GEMV=0 timeout 75 $LOOM bench latency $P --output-json $R/prefill8192-nogemv.json > $R/prefill8192-nogemv.log 2>&1
for f in prefill8192 prefill8192-nogemv; do echo "$f: $(grep -E '^Avg' $R/$f.log) $(grep -E '^Prefill' $R/$f.log | cut -c1-120)"; done; stamp prefill
timeout 90 $LOOM bench latency --model qwen3-30b-a3b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3 --output-json $R/qwen3-decode.json > $R/qwen3-decode.log 2>&1
echo "qwen3 decode: $(grep -E '^Decode' $R/qwen3-decode.log | head -1)"; tail -1 $R/qwen3-decode.log | cut -c1-200; stamp "qwen3 decode"
timeout $(left 585) $LOOM bench throughput --model qwen3-30b-a3b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown --output-json $R/qwen3-throughput.json > $R/qwen3-thr.log 2>&1
grep -E "^(Throughput|Compute floor|Prompt tokens computed)|^  (decode only|with prompt|steps')" $R/qwen3-thr.log | cut -c1-250; tail -1 $R/qwen3-thr.log | cut -c1-200
tar czf $OUT/ze.tgz -C $R . ; stamp done
