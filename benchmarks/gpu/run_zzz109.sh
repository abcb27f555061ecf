# 1 GPU (~7 min), for session 46: session 45's int4 kernels in their final form, end to end.
# 1. tests/kernels/test_int4_gemv.py and the int4 tile's conversions on the GPU;
# 2. loom bench int4 on 8B's projections at the three regimes: one row the GEMV (plain
#    range loop, 128 x 128 tiles: the H200 search's best, 8-25% under the tile), 2..16 the
#    tile (slabs, bf16 bits), 17+ dequantize + dense GEMM;
# 3. 8B AWQ decode at batch 1 (expected ~4.3 ms/token on an H200 from the kernel sums,
#    against 5.10 at 0b314fa's GEMV defaults) and batch 4, prefill 2048;
# 4. the int4 end-to-end GPU tests.
source benchmarks/gpu/env.sh; R=$OUT/zzz109; mkdir -p $R
timeout $(left 60) python3 -m pytest -q tests/kernels/test_int4_gemv.py -k "not sm90" \
  -p no:cacheprovider > $R/kernels.log 2>&1
echo "kernel tests rc $? $(tail -1 $R/kernels.log)"; grep -E "^(FAILED|E  )" $R/kernels.log | head -12
stamp tests
timeout $(left 200) $LOOM bench int4 --model llama-3.1-8b --batch-sizes 1 2 4 5 16 17 256 \
  --num-iters 10 --output-json $R/int4-kernel.json > $R/int4-kernel.log 2>&1
echo "bench int4 rc $?"; quiet < $R/int4-kernel.log | tail -29 | cut -c1-150
stamp int4
L="--load-format dummy --num-iters-warmup 2 --num-iters 4"
for name in b1-awq b4-awq prefill2048-awq; do
  [ $(left 420) -lt 60 ] && { echo "no time for $name"; continue; }
  case $name in
    b1-awq) args="--input-len 128 --output-len 128 --batch-size 1" ;;
    b4-awq) args="--input-len 128 --output-len 128 --batch-size 4" ;;
    prefill2048-awq) args="--input-len 2048 --output-len 1 --batch-size 1" ;;
  esac
  timeout $(left 430) $LOOM bench latency --model llama-3.1-8b-awq $L $args \
    --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|^Prefill' $R/$name.log | cut -c1-130 | tr '\n' ' ')"
done
stamp latency
timeout $(left 560) python3 -m pytest -q tests/e2e/test_gpu_int4.py -p no:cacheprovider > $R/e2e.log 2>&1
echo "e2e int4 rc $? $(tail -1 $R/e2e.log)"
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
