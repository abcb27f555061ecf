# 1 GPU (~4 min), session 12. run_zr: with the 8-bit KV cache, 8B throughput's decode-only
# steps ran at 1.80x their floors (1.34x in bf16). The decode and mixed attention kernels
# over a bf16 and an fp8 cache at throughput's shapes, against the KV-read floor, and the
# decode kernel's tiles searched for fp8 (--tune).
source benchmarks/gpu/env.sh
R=/tmp/zs; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
A="--batch-sizes 484 872 --context-lens 1150"
for kv in auto fp8; do
  timeout 100 $LOOM bench attention $A --kv-cache-dtype $kv --output-json $R/decode-$kv.json > $R/decode-$kv.log 2>&1
  echo "== decode $kv"; grep -E "^B=|tuned" $R/decode-$kv.log | cut -c1-200
  timeout 100 $LOOM bench attention --mode mixed --batch-sizes 500 --context-lens 1150 --prompt-tokens 16384 --kv-cache-dtype $kv --output-json $R/mixed-$kv.json > $R/mixed-$kv.log 2>&1
  echo "== mixed $kv"; grep -E "^B=|single" $R/mixed-$kv.log | cut -c1-200
done; stamp "attention"
timeout $(left 560) $LOOM bench attention $A --kv-cache-dtype fp8 --tune --tune-block-n 64 128 256 --tune-warps 4 8 --tune-stages 2 3 4 --tune-splits 1 --output-json $R/decode-fp8-tune.json > $R/decode-fp8-tune.log 2>&1
echo "== decode fp8 tune"; grep -E "^B=|tuned" $R/decode-fp8-tune.log | cut -c1-220; tail -3 $R/decode-fp8-tune.log
tar czf $OUT/zs.tgz -C $R . ; stamp done
