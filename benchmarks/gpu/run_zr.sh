# 1 GPU (~7 min), session 12. The 8-bit KV cache (--kv-cache-dtype fp8): its GPU tests, then
# 8B throughput (1000 x 1024 -> 256) at the defaults and with fp8 (decode-only steps spend
# 57% of their time in attention at the KV-read floor), and 1-GPU decode with fp8.
source benchmarks/gpu/env.sh
R=/tmp/zr; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_kv_cache_fp8.py > $R/tests.log 2>&1; tail -3 $R/tests.log; stamp tests
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
timeout 170 $LOOM bench throughput $T --kv-cache-dtype fp8 --output-json $R/thr8b-fp8.json > $R/thr8b-fp8.log 2>&1; stamp "thr fp8"
timeout 170 $LOOM bench throughput $T --output-json $R/thr8b.json > $R/thr8b.log 2>&1; stamp "thr auto"
for f in thr8b-fp8 thr8b; do echo "== $f"; grep -E "KV cache|^(Throughput|Compute floor)|^  (decode only|with prompt|steps')" $R/$f.log | cut -c1-220; done
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout $(left 570) $LOOM bench latency $D --kv-cache-dtype fp8 --output-json $R/tp1-decode-fp8.json > $R/tp1-decode-fp8.log 2>&1
echo "tp1 decode fp8: $(grep -E '^Decode' $R/tp1-decode-fp8.log)"
tar czf $OUT/zr.tgz -C $R . ; stamp done
