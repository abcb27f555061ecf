# 1 GPU (~7 min), for session 47: the fused MoE GEMV's integer path rewritten in session 46
# (loom/kernels/moe_gemv.py, unmeasured on a GPU when it landed). Each int4 value the float
# 128 + q by one prmt (8-bit: a shift and one lop3), one FMA, per-thread sums until the
# loop ends; before, values were unpacked whole through shared memory, converted by I2F
# and reduced across threads every chunk. Offline sm_90 SASS of the loop: ~5-11
# instructions a value against ~23-29 (the H200 table's 8 x 512 and 4 x 1024 chunks).
# 1. the int4 / 8-bit fused MoE tests on the GPU (prmt's results against float64);
# 2. benchmarks/gpu/moe_gemv_ab.py: new against old (the module at 102aae1: before the run,
#    `git show 102aae1:loom/kernels/moe_gemv.py > benchmarks/gpu/moe_gemv_old.py`, untracked
#    but carried with the working tree), alternated, Qwen3-30B-A3B's experts at 1, 2, 4
#    tokens, int4 and 8-bit. Expected: the old form issue-bound (~25 instructions a
#    value: ~30 us a layer at one token on an H200), the new one near its loads' latency;
#    revert moe_gemv.py's integer path if the new form is slower;
# 3. Qwen3-30B-A3B GPTQ-Int4 (dummy weights) decode at batch 1 with the new form.
source benchmarks/gpu/env.sh; R=$OUT/zzz113; mkdir -p $R
timeout $(left 150) python3 -m pytest -q tests/kernels/test_fused_moe_int4.py \
  tests/kernels/test_fused_moe_int8.py -k "not sm90" -p no:cacheprovider > $R/kernels.log 2>&1
echo "kernel tests rc $? $(tail -1 $R/kernels.log)"; grep -E "^(FAILED|E  )" $R/kernels.log | head -12
stamp tests
timeout $(left 400) python3 benchmarks/gpu/moe_gemv_ab.py --out $R/moe-gemv-ab.json \
  2>&1 | grep -v -E "^(INFO|DEBUG)" > $R/moe-gemv-ab.log
echo "ab rc $?"; cat $R/moe-gemv-ab.log | cut -c1-150
stamp ab
L="--load-format dummy --num-iters-warmup 2 --num-iters 4"
timeout $(left 580) $LOOM bench latency --model qwen3-30b-a3b-gptq-int4 $L --input-len 128 \
  --output-len 128 --batch-size 1 --output-json $R/qwen3-b1-int4.json > $R/qwen3-b1-int4.log 2>&1
echo "qwen3 b1 rc $? $(grep -E '^Avg|^Decode' $R/qwen3-b1-int4.log | cut -c1-150 | tr '\n' ' ')"
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
