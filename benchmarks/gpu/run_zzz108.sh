# 1 GPU (~7 min), session 45: the int4 CUDA-core GEMV (loom/kernels/int4_gemv.py), new.
# Ran at 0b314fa (H200) and 220e4a3 (H100, the loop pipelined: far slower, reverted);
# results in benchmarks/results/*-session45-zzz108-*/. Rerun it to time the final form
# (plain range, 128 x 128 tiles, one row alone) end to end.
# 1. tests/kernels/test_int4_gemv.py and the int4 tile's conversions on the GPU;
# 2. int4_tune.py --stages gemv on 8B's projections: the GEMV's grid at M = 1 (2, 4) beside
#    the tiled kernel's new default (slabs, bf16 bits: 0.17-0.30 of copy at M = 1 in
#    zzz107) and bf16. Expected: offline SASS ~6 instructions a value, so ~5 us of issue
#    for qkv's 25M values against its ~4.4 us copy floor;
# 3. 8B AWQ decode b1 end to end with the GEMV (8.0 ms/token, 4.21x floor, at de41cb4).
source benchmarks/gpu/env.sh; R=$OUT/zzz108; mkdir -p $R
timeout $(left 60) python3 -m pytest -q tests/kernels/test_int4_gemv.py -k "not sm90" \
  -p no:cacheprovider > $R/kernels.log 2>&1
echo "kernel tests rc $? $(tail -1 $R/kernels.log)"; grep -E "^(FAILED|E  )" $R/kernels.log | head -12
stamp tests
timeout $(left 330) python3 benchmarks/gpu/int4_tune.py --stages gemv --budget-s $(left 280) \
  --out $R/int4-gemv.json 2>&1 | grep -v -E "^(INFO|DEBUG)" > $R/int4-gemv.log
echo "tune rc $?"; grep -E "^\S|\[gemv\]|\[tiled\]|bf16|budget" $R/int4-gemv.log \
  | awk '/\[gemv\].*M=1:/{c[$2]++; if (c[$2]>3) next} {print}' | cut -c1-170
stamp tune
L="--load-format dummy --num-iters-warmup 2 --num-iters 4"
timeout $(left 440) $LOOM bench latency --model llama-3.1-8b-awq $L --input-len 128 \
  --output-len 128 --batch-size 1 --output-json $R/b1-awq.json > $R/b1-awq.log 2>&1
echo "b1-awq rc $? $(grep -E '^Avg|^Decode' $R/b1-awq.log | cut -c1-150 | tr '\n' ' ')"
stamp latency
