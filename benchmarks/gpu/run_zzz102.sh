# 1 GPU (~9 min), written in session 43: int8 W8A8 (compressed-tensors int-quantized;
# 7b3fa74, d128109). Needs compressed-tensors and loguru in .whl (wheels.sh fetches them).
# 1. the int8 kernel tests and tiny int8 models on the GPU (interpreted and sm_90-compiled
#    only so far), with the fp8 op's tests (the op now takes both);
# 2. loom bench w8a8: Llama-3.1-8B's projections, the op with int8 weights beside fp8 and
#    bf16, and past the GEMV's rows loom's Triton int8 GEMM against torch._int_mm + scaling.
#    Ceilings in the run: copy, bf16, fp8 and int8 (_int_mm 8192^3) rates. Expected: decode
#    rows as fp8's (same bytes, same GEMV); prompt rows ~0.5-0.8 of the int8 rate with the
#    guessed tiles (fp8's _scaled_mm ran 1.6-1.8x bf16's rate at 8192 rows, run_zzz94);
# 3. llama-3.1-8b-w8a8 (dummy) decode b1 128 -> 128, prefill 8192 beside --quantization fp8's
#    prefill 8192. Floors: decode 8.0 GB a token (projections 1 B a weight, embeddings and
#    LM head bf16) / copy, ~1.9 ms at 4.17 TB/s; prefill 132 TFLOP / the int8 rate.
source benchmarks/gpu/env.sh; R=$OUT/zzz102; mkdir -p $R
timeout $(left 170) python3 -m pytest -q tests/kernels/test_int8_gemm.py tests/kernels/test_int8_linear.py \
  tests/kernels/test_fp8_linear.py tests/e2e/test_gpu_int8.py -p no:cacheprovider > $R/tests-int8.log 2>&1
echo "int8 tests rc $? $(tail -1 $R/tests-int8.log)"; grep -E "^(FAILED|ERROR)" $R/tests-int8.log | head -6
stamp tests
timeout $(left 330) $LOOM bench w8a8 --model llama-3.1-8b --batch-sizes 1 4 16 64 256 1024 4096 8192 \
  --output-json $R/w8a8-kernel.json > $R/w8a8-kernel.log 2>&1
echo "bench w8a8 rc $?"; quiet < $R/w8a8-kernel.log | tail -34 | cut -c1-170
stamp kernel
L="--load-format dummy --num-iters-warmup 2 --input-len 128 --output-len 128 --num-iters 5 --batch-size 1"
P="--load-format dummy --input-len 8192 --output-len 1 --num-iters-warmup 2 --num-iters 4"
for name in b1-w8a8 prefill8192-w8a8 prefill8192-fp8; do
  [ $(left 560) -lt 60 ] && { echo "no time for $name"; continue; }
  case $name in
    b1-w8a8) args="--model llama-3.1-8b-w8a8 $L" ;;
    prefill8192-w8a8) args="--model llama-3.1-8b-w8a8 $P" ;;
    prefill8192-fp8) args="--model llama-3.1-8b --quantization fp8 $P" ;;
  esac
  timeout $(left 570) $LOOM bench latency $args --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|^Prefill' $R/$name.log | cut -c1-130 | tr '\n' ' ')"
done
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz102.tgz -C $R .
