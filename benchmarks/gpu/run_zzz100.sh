# 1 GPU (~9 min), written in session 42 (no device lent) for a later session: int4
# weight-only layers (W4A16: AWQ, GPTQ, compressed-tensors pack-quantized; 9666346, 2a268c9).
# Needs compressed-tensors and loguru in .whl (benchmarks/gpu/wheels.sh fetches them).
# 1. the int4 kernel tests on the GPU (CPU-interpreted and sm_90-compiled only so far) and
#    the tiny int4 models on the GPU against the CPU (tests/e2e/test_gpu_int4.py);
# 2. loom bench int4: Llama-3.1-8B's four projections, groups of 128 with zero points (AWQ),
#    then 8-bit symmetric (GPTQ-Int8) at M = 1, 16, 4096 (floor: 1.016 B a weight over copy);
#    M = 1..4096, beside bf16. Floor at decode rows: the int4 bytes (0.52 B a weight) over the
#    copy rate; expected ~0.6-0.8 of copy at M<=16 with the guessed tiles, x2.5-3.5 over bf16;
#    prompt rows (compute-bound) slower than bf16 (integer -> bf16 conversion in the loop);
# 3. Llama-3.1-8B AWQ shapes (dummy weights, llama-3.1-8b-awq): decode b1 128 -> 128 beside
#    bf16, prefill 2048. Floor: 5.75 GB a token (linear weights in int4, embeddings and LM
#    head bf16) / copy = ~1.38 ms at 4.17 TB/s; bf16's run_zzz96 figure 4.138 ms.
source benchmarks/gpu/env.sh; R=$OUT/zzz100; mkdir -p $R
timeout $(left 150) python3 -m pytest -q tests/kernels/test_int4_linear.py tests/e2e/test_gpu_int4.py \
  -p no:cacheprovider > $R/tests-int4.log 2>&1
echo "int4 tests rc $? $(tail -1 $R/tests-int4.log)"; grep -E "^(FAILED|ERROR)" $R/tests-int4.log | head -6
stamp tests
timeout $(left 300) $LOOM bench int4 --model llama-3.1-8b --output-json $R/int4-kernel.json \
  > $R/int4-kernel.log 2>&1
echo "bench int4 rc $?"; quiet < $R/int4-kernel.log | tail -40 | cut -c1-150
timeout $(left 360) $LOOM bench int4 --model llama-3.1-8b --bits 8 --symmetric --batch-sizes 1 16 4096 \
  --output-json $R/int8-kernel.json > $R/int8-kernel.log 2>&1
echo "bench int4 --bits 8 rc $?"; quiet < $R/int8-kernel.log | tail -14 | cut -c1-150
stamp kernel
L="--load-format dummy --num-iters-warmup 2 --input-len 128 --output-len 128 --num-iters 5 --batch-size 1"
for name in b1-awq b1-bf16 prefill2048-awq; do
  [ $(left 560) -lt 60 ] && { echo "no time for $name"; continue; }
  case $name in
    b1-awq) args="--model llama-3.1-8b-awq $L" ;;
    b1-bf16) args="--model llama-3.1-8b $L" ;;
    prefill2048-awq) args="--model llama-3.1-8b-awq --load-format dummy --input-len 2048 --output-len 1 --num-iters-warmup 2 --num-iters 5" ;;
  esac
  timeout $(left 570) $LOOM bench latency $args --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|^Prefill' $R/$name.log | cut -c1-130 | tr '\n' ' ')"
done
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz100.tgz -C $R .
