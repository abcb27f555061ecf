# 1 GPU (~10 min), session 43: the first GPU look at sessions 42-43's integer weights in one
# start (device starts kept failing): int4 W4A16 (run_zzz100's subset) and int8 W8A8
# (run_zzz102's subset). Needs compressed-tensors and loguru in .whl.
# 1. int4 and int8 kernel tests and the tiny int4 / int8 models on the GPU against the CPU
#    (and session 44's encoder and GGUF MoE paths);
# 2. loom bench w8a8 and loom bench int4 on Llama-3.1-8B's projections (see run_zzz102 and
#    run_zzz100 for what each expects);
# 3. decode b1 128 -> 128 of llama-3.1-8b-awq (floor 5.75 GB / copy ~1.38 ms) and
#    llama-3.1-8b-w8a8 (8.0 GB / copy ~1.9 ms), prefill 8192 of w8a8 (132 TFLOP / int8 rate).
source benchmarks/gpu/env.sh; R=$OUT/zzz103; mkdir -p $R
timeout $(left 190) python3 -m pytest -q tests/kernels/test_int4_linear.py tests/kernels/test_int8_gemm.py \
  tests/kernels/test_int8_linear.py tests/kernels/test_fused_moe_int8.py tests/e2e/test_gpu_int4.py \
  tests/e2e/test_gpu_int8.py tests/e2e/test_gpu_encoders_gguf.py \
  -p no:cacheprovider > $R/tests.log 2>&1
echo "tests rc $? $(tail -1 $R/tests.log)"; grep -E "^(FAILED|ERROR)" $R/tests.log | head -8
stamp tests
timeout $(left 290) $LOOM bench w8a8 --model llama-3.1-8b --batch-sizes 1 16 256 4096 8192 \
  --num-iters 10 --output-json $R/w8a8-kernel.json > $R/w8a8-kernel.log 2>&1
echo "bench w8a8 rc $?"; quiet < $R/w8a8-kernel.log | tail -22 | cut -c1-170
stamp w8a8
timeout $(left 360) $LOOM bench int4 --model llama-3.1-8b --batch-sizes 1 16 256 4096 --num-iters 10 \
  --output-json $R/int4-kernel.json > $R/int4-kernel.log 2>&1
echo "bench int4 rc $?"; quiet < $R/int4-kernel.log | tail -17 | cut -c1-150
stamp int4
L="--load-format dummy --num-iters-warmup 2 --input-len 128 --output-len 128 --num-iters 4 --batch-size 1"
P="--load-format dummy --input-len 8192 --output-len 1 --num-iters-warmup 1 --num-iters 3"
for name in b1-awq b1-w8a8 prefill8192-w8a8; do
  [ $(left 585) -lt 70 ] && { echo "no time for $name"; continue; }
  case $name in
    b1-awq) args="--model llama-3.1-8b-awq $L" ;;
    b1-w8a8) args="--model llama-3.1-8b-w8a8 $L" ;;
    prefill8192-w8a8) args="--model llama-3.1-8b-w8a8 $P" ;;
  esac
  timeout $(left 590) $LOOM bench latency $args --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|^Prefill' $R/$name.log | cut -c1-130 | tr '\n' ' ')"
done
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz103.tgz -C $R .
