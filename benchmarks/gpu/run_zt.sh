# 1 GPU (~5 min), session 12. run_zs: over an fp8 cache the decode kernel took as long as
# over bf16 (503 against 524 us at 484 x 1150; 1.86x its floor): its PTX converts each 8-bit
# key to fp16 and then to bf16 one element at a time. Now the dots run in fp16 beside an
# 8-bit cache. Its GPU tests, the kernels again, then 8B throughput and decode with fp8.
source benchmarks/gpu/env.sh
R=/tmp/zt; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_kv_cache_fp8.py tests/kernels/test_paged_attention.py > $R/tests.log 2>&1; tail -3 $R/tests.log; stamp tests
for kv in fp8 auto; do
  timeout 100 $LOOM bench attention --batch-sizes 1 484 872 --context-lens 1150 --kv-cache-dtype $kv --output-json $R/decode-$kv.json > $R/decode-$kv.log 2>&1
  echo "== decode $kv"; grep -E "^B=" $R/decode-$kv.log | cut -c1-200
  timeout 100 $LOOM bench attention --mode mixed --batch-sizes 500 --context-lens 1150 --prompt-tokens 16384 --kv-cache-dtype $kv --output-json $R/mixed-$kv.json > $R/mixed-$kv.log 2>&1
  echo "== mixed $kv"; grep -E "^B=" $R/mixed-$kv.log | cut -c1-200
done; stamp "attention"
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
timeout 170 $LOOM bench throughput $T --kv-cache-dtype fp8 --output-json $R/thr8b-fp8.json > $R/thr8b-fp8.log 2>&1; stamp "thr fp8"
echo "== thr8b-fp8"; grep -E "^(Throughput|Compute floor)|^  (decode only|with prompt|steps')" $R/thr8b-fp8.log | cut -c1-220
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout $(left 570) $LOOM bench latency $D --kv-cache-dtype fp8 --output-json $R/tp1-decode-fp8.json > $R/tp1-decode-fp8.log 2>&1
echo "tp1 decode fp8: $(grep -E '^Decode' $R/tp1-decode-fp8.log)"
tar czf $OUT/zt.tgz -C $R . ; stamp done
