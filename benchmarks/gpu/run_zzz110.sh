# 1 GPU (~8 min), session 46: the int4 GEMV rewritten (loom/kernels/int4_gemv.py): each value
# put under float32's exponent of 128 (the float 128 + q) by one prmt (or a shift and one
# lop3), its one FMA a row, the zero point off once a word; no shared memory in the loop.
# Offline sm_90 SASS: ~3.4 instructions a value at one row (256 rows, prmt) against
# session 45's ~7.1 (shared-memory layout change and 10 barriers a step).
# 1. tests/kernels/test_int4_gemv.py on the GPU (prmt's results against float64);
# 2. int4_tune.py --stages gemv on 8B's projections: the grid (rows, warps, prmt or shift,
#    prefetch, K split) at M = 1, best at M = 2..4, beside session 45's GEMV (H200: qkv
#    18.8, o 17.1, gate_up 56.6, down 35.2 us at M = 1, 0.12-0.26 of copy) and the tile,
#    and the tile's default at M = 1..16 (2..5 rows measured slower than 16 in zzz109).
#    Expected: issue-bound ~4 us for qkv (25M values x ~3.4 over 132 SMs x 4 x 32 lanes
#    x ~1.75 GHz) against its ~3.1 us copy floor, if the loads' latency is covered;
# 3. 8B AWQ decode b1 end to end with the new default (4.212 ms/token, 3.10x floor, at
#    12294a2 on an H200).
source benchmarks/gpu/env.sh; R=$OUT/zzz110; mkdir -p $R
timeout $(left 60) python3 -m pytest -q tests/kernels/test_int4_gemv.py -k "not sm90" \
  -p no:cacheprovider > $R/kernels.log 2>&1
echo "kernel tests rc $? $(tail -1 $R/kernels.log)"; grep -E "^(FAILED|E  )" $R/kernels.log | head -12
stamp tests
timeout $(left 400) python3 benchmarks/gpu/int4_tune.py --stages gemv --budget-s $(left 340) \
  --out $R/int4-gemv.json 2>&1 | grep -v -E "^(INFO|DEBUG)" > $R/int4-gemv.log
echo "tune rc $?"; grep -E "^\S|\[gemv\]|\[old-gemv\]|\[tiled\]|bf16|budget" $R/int4-gemv.log \
  | awk '/\[gemv\].*M=1:/{c[$2]++; if (c[$2]>4) next} {print}' | cut -c1-170
stamp tune
L="--load-format dummy --num-iters-warmup 2 --num-iters 4"
timeout $(left 540) $LOOM bench latency --model llama-3.1-8b-awq $L --input-len 128 \
  --output-len 128 --batch-size 1 --output-json $R/b1-awq.json > $R/b1-awq.log 2>&1
echo "b1-awq rc $? $(grep -E '^Avg|^Decode' $R/b1-awq.log | cut -c1-150 | tr '\n' ' ')"
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
