# 1 GPU (~8 min), written in session 42 (no device lent) for a later session: int4 MoE
# experts (W4A16 in the fused MoE's grouped GEMM and GEMV; e1c4f68, df0d62a). Needs
# compressed-tensors and loguru in .whl (benchmarks/gpu/wheels.sh fetches them).
# 1. the int4 MoE kernel tests on the GPU (CPU-interpreted and sm_90-compiled only so far);
# 2. loom bench moe --weight-dtype int4 and int8 (Qwen3-30B-A3B shapes, groups of 128, zero
#    points) beside auto (bf16). Expected: decode sizes ~3x faster than bf16 (0.52 of 2 bytes a
#    weight) if the GEMV reaches bf16's fraction of the copy rate; prompt sizes slower than
#    bf16 (unpacking in the K loop, the bf16 table's tiles);
# 3. Qwen3-30B-A3B GPTQ-Int4 shapes (dummy weights, qwen3-30b-a3b-gptq-int4) decode b1
#    128 -> 128. Floor: the int4 decode bytes over copy (floors.decode_bytes with 0.52 B a
#    weight); the bf16 figure of the same shapes is run_zzz99's / run_zzz96's.
source benchmarks/gpu/env.sh; R=$OUT/zzz101; mkdir -p $R
timeout $(left 120) python3 -m pytest -q tests/kernels/test_fused_moe_int4.py -p no:cacheprovider \
  > $R/tests-moe-int4.log 2>&1
echo "moe int4 tests rc $? $(tail -1 $R/tests-moe-int4.log)"; grep -E "^(FAILED|ERROR)" $R/tests-moe-int4.log | head -4
stamp tests
for w in int4 auto int8; do  # bf16 (auto), the peer, before int8
  [ $(left 380) -lt 40 ] && { echo "no time for moe $w"; continue; }
  timeout $(left 390) $LOOM bench moe --weight-dtype $w --batch-sizes 1 2 4 8 16 64 256 1024 4096 \
    --output-json $R/moe-$w.json > $R/moe-$w.log 2>&1
  echo "moe $w rc $?"; quiet < $R/moe-$w.log | tail -12 | cut -c1-150
done
stamp moe
L="--load-format dummy --num-iters-warmup 2 --input-len 128 --output-len 128 --num-iters 4 --batch-size 1"
[ $(left 470) -gt 70 ] && {
  timeout $(left 480) $LOOM bench latency --model qwen3-30b-a3b-gptq-int4 $L --output-json $R/b1-int4.json \
    > $R/b1-int4.log 2>&1
  echo "b1-int4 rc $? $(grep -E '^Avg|^Decode' $R/b1-int4.log | cut -c1-130 | tr '\n' ' ')"; }
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz101.tgz -C $R .
