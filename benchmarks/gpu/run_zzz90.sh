# 1 GPU (~9 min), written in session 39 (no GPU was lent then): fp8 linear layers
# (--quantization fp8: float8_e4m3fn weights, a scale per output channel, activations per
# token, torch._scaled_mm with row-wise scales) on 8B dummy weights, beside bf16 in the same
# run. Floors (loom.bench.floors): fp8 reads 9.08 GB a decode step against bf16's 16.06
# (2.18 ms against 3.85 ms at 4.17 TB/s); compute floors take the fp8 _scaled_mm rate the
# run measures (expected ~2x bf16's). Expected: decode b1 well above its floor until
# _scaled_mm's M=1 GEMV-shaped GEMMs are measured (cuBLASLt at M=1 may read weights slower
# than the copy rate; loom's Triton GEMV covers bf16 only), prefill 8192 near 1.6-1.8x
# bf16's speed, per-token quantization fused by Inductor into one kernel per projection.
source benchmarks/gpu/env.sh; R=$OUT/zzz90; mkdir -p $R
timeout $(left 150) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py tests/bench/test_floors_and_ceilings.py \
  -k "fp8 or ceilings" -p no:cacheprovider > $R/tests-gpu.log 2>&1
echo "fp8 tests rc $? $(tail -1 $R/tests-gpu.log)"
stamp tests
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 3 --num-iters 8"
run() {  # name, flags...
  local name=$1; shift
  [ $(left 560) -lt 60 ] && { echo "no time for $name"; return; }
  timeout $(left 570) $LOOM bench latency $L "$@" --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|^Prefill|ceiling' $R/$name.log | cut -c1-110 | tr '\n' ' ')"
}
run b1-fp8 --batch-size 1 --input-len 128 --output-len 128 -q fp8
run b1 --batch-size 1 --input-len 128 --output-len 128
run prefill8192-fp8 --batch-size 1 --input-len 8192 --output-len 1 -q fp8
run b8-fp8 --batch-size 8 --input-len 128 --output-len 128 -q fp8
run prefill8192 --batch-size 1 --input-len 8192 --output-len 1
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz90.tgz -C $R .
