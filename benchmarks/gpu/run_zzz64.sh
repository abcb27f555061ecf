# 1 GPU (~5 min), session 30: cudagraph_mode PIECEWISE and FULL on CUDA. The GPU tests that
# run them against the CPU and against FULL_DECODE_ONLY's tokens; then 8B decode at batch 1,
# 128 -> 128, under PIECEWISE (decode steps through the pieces, attention eager between them)
# beside the default FULL_AND_PIECEWISE, one run each.
source benchmarks/gpu/env.sh; R=$OUT/zzz64; mkdir -p $R
timeout $(left 210) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py tests/compilation/test_piece_graph.py \
  -k "piecewise or PIECEWISE or lone or pieces_of_many" > $R/tests.log 2>&1; echo "gpu tests rc $?"; tail -4 $R/tests.log; stamp tests
L="--model llama-3.1-8b --load-format dummy --input-len 128 --output-len 128 --num-iters-warmup 2 --num-iters 4 --batch-size 1"
for mode in PIECEWISE FULL_AND_PIECEWISE; do
  [ $(left 330) -lt 60 ] && { echo "no time for $mode"; continue; }
  timeout $(left 330) $LOOM bench latency $L -O.cudagraph_mode=$mode --output-json $R/lat-$mode.json > $R/lat-$mode.log 2>&1
  echo "$mode rc $? $(grep -E '^Decode' $R/lat-$mode.log | cut -c1-60)"; grep -E "padded to|cudagraph_mode" $R/lat-$mode.log | head -2 | cut -c1-200; stamp $mode
done
tar czf $OUT/zzz64.tgz -C $R .
