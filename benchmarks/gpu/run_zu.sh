# 1 GPU (~3.5 min), session 12. run_zt: dots in fp16 took the fp8 decode kernel from 503 to
# 467 us (484 x 1150; 1.73x its floor); its PTX still read each 8-bit value from shared
# memory a byte at a time (no 8-bit ldmatrix.trans). Now values load as V^T and transpose
# after their conversion. The kernels over fp8 (and a tile search), then 8B throughput.
source benchmarks/gpu/env.sh
R=/tmp/zu; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_kv_cache_fp8.py > $R/tests.log 2>&1; tail -2 $R/tests.log; stamp tests
timeout 100 $LOOM bench attention --batch-sizes 1 484 872 --context-lens 1150 --kv-cache-dtype fp8 --tune --tune-block-n 64 128 --tune-warps 4 8 --tune-stages 2 3 4 --tune-splits 1 --output-json $R/decode-fp8.json > $R/decode-fp8.log 2>&1
echo "== decode fp8"; grep -E "^B=|tuned" $R/decode-fp8.log | cut -c1-200
timeout 100 $LOOM bench attention --mode mixed --batch-sizes 500 --context-lens 1150 --prompt-tokens 16384 --kv-cache-dtype fp8 --output-json $R/mixed-fp8.json > $R/mixed-fp8.log 2>&1
echo "== mixed fp8"; grep -E "^B=" $R/mixed-fp8.log | cut -c1-200; stamp attention
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
timeout $(left 400) $LOOM bench throughput $T --kv-cache-dtype fp8 --output-json $R/thr8b-fp8.json > $R/thr8b-fp8.log 2>&1; stamp "thr fp8"
echo "== thr8b-fp8"; grep -E "^(Throughput|Compute floor)|^  (decode only|with prompt|steps')" $R/thr8b-fp8.log | cut -c1-220
tar czf $OUT/zu.tgz -C $R . ; stamp done
