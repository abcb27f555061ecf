# 1 GPU (~2 min), session 12. The 8-bit values now load as 16-bit pairs split by bit
# operations (their PTX: asynchronous copies, ldmatrix.trans, no byte-wise shared reads).
# GPU tests, then the decode and mixed kernels over fp8 and bf16 (run_zt: 467 / 898 us at
# 484 / 872 x 1150 over fp8, 536 / 952 over bf16).
source benchmarks/gpu/env.sh
R=/tmp/zw; mkdir -p $R
timeout 120 python3 -m pytest -q -m gpu tests/kernels/test_kv_cache_fp8.py tests/kernels/test_paged_attention.py > $R/tests.log 2>&1; tail -2 $R/tests.log; stamp tests
for kv in fp8 auto; do
  timeout 80 $LOOM bench attention --batch-sizes 484 872 --context-lens 1150 --kv-cache-dtype $kv --output-json $R/decode-$kv.json > $R/decode-$kv.log 2>&1
  echo "== decode $kv"; grep -E "^B=" $R/decode-$kv.log | cut -c1-200
done
timeout 80 $LOOM bench attention --mode mixed --batch-sizes 500 --context-lens 1150 --prompt-tokens 16384 --kv-cache-dtype fp8 --output-json $R/mixed-fp8.json > $R/mixed-fp8.log 2>&1
echo "== mixed fp8"; grep -E "^B=" $R/mixed-fp8.log | cut -c1-200
tar czf $OUT/zw.tgz -C $R . ; stamp done
