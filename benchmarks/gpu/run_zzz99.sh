# 1 GPU (~9 min), written in session 41 (no device lent) for a later session: fp8 MoE
# experts kept fp8 (W8A16 in the grouped GEMM and the MoE GEMV; c0b25ae, 97d1e95).
# 1. the fp8 MoE kernel tests on the GPU (CPU-interpreted and sm_90-compiled only so far);
# 2. loom bench moe, Qwen3-30B-A3B shapes, bf16 / fp8 per channel / fp8 128x128 blocks,
#    decode and prompt sizes (the fp8 experts take the bf16 table's tiles). Expected: the
#    decode sizes ~2x faster (half the bytes), prompt sizes within 5-15% of bf16;
# 3. Qwen3-30B-A3B decode b1 128 -> 128, dummy weights, -q fp8 beside bf16 (floor: fp8
#    experts halve ~4.6 of the 6.6 GB a token reads).
source benchmarks/gpu/env.sh; R=$OUT/zzz99; mkdir -p $R
timeout $(left 150) python3 -m pytest -q tests/kernels/test_fused_moe_fp8.py tests/kernels/test_fused_moe.py \
  -p no:cacheprovider > $R/tests-moe.log 2>&1
echo "moe kernel tests rc $? $(tail -1 $R/tests-moe.log)"; grep -E "^(FAILED|ERROR)" $R/tests-moe.log | head -4
stamp tests
for w in auto fp8 fp8-block; do
  [ $(left 330) -lt 40 ] && { echo "no time for moe $w"; continue; }
  timeout $(left 340) $LOOM bench moe --weight-dtype $w --batch-sizes 1 2 4 8 16 64 256 1024 4096 \
    --output-json $R/moe-$w.json > $R/moe-$w.log 2>&1
  echo "moe $w rc $?"; quiet < $R/moe-$w.log | tail -12 | cut -c1-150
done
stamp moe
L="--model qwen3-30b-a3b --load-format dummy --num-iters-warmup 2 --input-len 128 --output-len 128 --num-iters 4 --batch-size 1"
for name in b1-fp8 b1; do
  [ $(left 560) -lt 70 ] && { echo "no time for $name"; continue; }
  extra=""; [ $name = b1-fp8 ] && extra="-q fp8"
  timeout $(left 570) $LOOM bench latency $L $extra --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode' $R/$name.log | cut -c1-130 | tr '\n' ' ')"
done
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz99.tgz -C $R .
