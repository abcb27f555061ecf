# 1 GPU (~8 min), session 44's follow-ups after its H100 run (results/h100-session44-zzz103):
# 1. tests/kernels/test_int8_linear.py whole, with its report: one of its tests failed on the
#    H100 and the time budget cut the report off;
# 2. loom bench int4 on 8B's projections: prompt rows (> 16) now dequantize the weight and
#    run the dense GEMM (expect ~bf16's time plus 2.5 bytes a value over the copy rate,
#    ~21 us for qkv_proj), decode rows the split-K kernel (0.12-0.17 of copy on the H100);
# 3. 8B AWQ: prefill 2048 (against bf16's floor; the dequantize's share) and decode b1;
# 4. the int4 end-to-end GPU tests.
source benchmarks/gpu/env.sh; R=$OUT/zzz106; mkdir -p $R
timeout $(left 150) python3 -m pytest -q tests/kernels/test_int8_linear.py -p no:cacheprovider \
  > $R/int8-linear.log 2>&1
echo "int8 linear rc $? $(tail -1 $R/int8-linear.log)"; grep -E "^(FAILED|E  )" $R/int8-linear.log | head -12
stamp int8
timeout $(left 260) $LOOM bench int4 --model llama-3.1-8b --batch-sizes 1 16 17 256 4096 --num-iters 10 \
  --output-json $R/int4-kernel.json > $R/int4-kernel.log 2>&1
echo "bench int4 rc $?"; quiet < $R/int4-kernel.log | tail -21 | cut -c1-150
stamp int4
L="--load-format dummy --num-iters-warmup 2 --num-iters 4"
for name in prefill2048-awq b1-awq; do
  [ $(left 420) -lt 60 ] && { echo "no time for $name"; continue; }
  case $name in
    prefill2048-awq) args="--model llama-3.1-8b-awq $L --input-len 2048 --output-len 1 --batch-size 1" ;;
    b1-awq) args="--model llama-3.1-8b-awq $L --input-len 128 --output-len 128 --batch-size 1" ;;
  esac
  timeout $(left 430) $LOOM bench latency $args --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|^Prefill' $R/$name.log | cut -c1-130 | tr '\n' ' ')"
done
stamp latency
timeout $(left 560) python3 -m pytest -q tests/e2e/test_gpu_int4.py -p no:cacheprovider > $R/e2e.log 2>&1
echo "e2e int4 rc $? $(tail -1 $R/e2e.log)"
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz106.tgz -C $R .
