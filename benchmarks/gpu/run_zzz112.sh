# 1 GPU (~6 min), session 46: the int4 GEMV's final defaults end to end. One row: 8 weight
# rows a program on one warp, 256 values a step, K split for ~16 programs per SM (zzz111's
# best uniform form: 98.7 us over 8B's four projections against 109.7 for zzz110's);
# two rows: 128 rows, 2 warps (the tile beyond).
# 1. tests/kernels/test_int4_gemv.py on the GPU;
# 2. loom bench int4 at 1, 2, 3, 16 rows (the op: GEMV, GEMV, tile, tile) beside bf16;
# 3. 8B AWQ decode b1 / b2 (H100 at b2bbe28: 3.524 / 4.241 ms/token, 1.85x / 2.23x the
#    floor); expected b1 ~3.2-3.3 from zzz111's kernel sums;
# 4. the int4 end-to-end GPU tests.
source benchmarks/gpu/env.sh; R=$OUT/zzz112; mkdir -p $R
timeout $(left 70) python3 -m pytest -q tests/kernels/test_int4_gemv.py -k "not sm90" \
  -p no:cacheprovider > $R/kernels.log 2>&1
echo "kernel tests rc $? $(tail -1 $R/kernels.log)"; grep -E "^(FAILED|E  )" $R/kernels.log | head -12
stamp tests
timeout $(left 160) $LOOM bench int4 --model llama-3.1-8b --batch-sizes 1 2 3 16 \
  --num-iters 10 --output-json $R/int4-kernel.json > $R/int4-kernel.log 2>&1
echo "bench int4 rc $?"; quiet < $R/int4-kernel.log | tail -17 | cut -c1-130
stamp int4
L="--load-format dummy --num-iters-warmup 2 --num-iters 4"
for b in 1 2; do
  timeout $(left 290) $LOOM bench latency --model llama-3.1-8b-awq $L --input-len 128 \
    --output-len 128 --batch-size $b --output-json $R/b$b-awq.json > $R/b$b-awq.log 2>&1
  echo "b$b-awq rc $? $(grep -E '^Avg|^Decode' $R/b$b-awq.log | cut -c1-150 | tr '\n' ' ')"
done
stamp latency
timeout $(left 450) python3 -m pytest -q tests/e2e/test_gpu_int4.py -p no:cacheprovider > $R/e2e.log 2>&1
echo "e2e int4 rc $? $(tail -1 $R/e2e.log)"; grep -E "^(FAILED|E  )" $R/e2e.log | head -8
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
