# 1 GPU (~9 min), session 13. The fused MoE's GEMV kernels for a handful of tokens
# (loom/kernels/moe_gemv.py; the grouped GEMM took 43 us at one token against the 18 us its
# 8 experts' weights take to read, run_zy).
# 1. The MoE GPU tests (the GEMV config beside the tuned one).
# 2. `loom bench moe --tune` at 1, 2, 4, 8 tokens (the GEMV kernels now in its grid up to two
#    rows per expert) into a copy of the shipped table; both tables timed in turn.
# 3. Qwen3-30B-A3B decode, batch 1, with the shipped table and the new one; the new one
#    profiled, its steps by kernel kind (decode_steps.py).
source benchmarks/gpu/env.sh
R=/tmp/zz; mkdir -p $R/cfg
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 100 python3 -m pytest -q -m gpu tests/kernels/test_fused_moe.py tests/kernels/test_fused_moe_configs.py > $R/tests.log 2>&1; tail -2 $R/tests.log; stamp tests
cp loom/kernels/configs/E=128*.json $R/cfg/
B="1 2 4 8 16"
timeout 150 $LOOM bench moe --tune --batch-sizes $B --save-dir $R/cfg --output-json $R/tune.json > $R/tune.log 2>&1
grep -E "^(M=|compiled|Wrote)" $R/tune.log | cut -c1-200; tail -2 $R/tune.log | cut -c1-300; stamp tune
timeout 40 $LOOM bench moe --batch-sizes $B --output-json $R/shipped.json > $R/shipped.log 2>&1
LOOM_MOE_CONFIG_DIR=$R/cfg timeout 40 $LOOM bench moe --batch-sizes $B --output-json $R/new.json > $R/new.log 2>&1
paste <(grep "^M=" $R/shipped.log | awk '{print $2, $(NF-7)}') <(grep "^M=" $R/new.log | awk '{print $(NF-7)}'); stamp "shipped vs new"
D="--model qwen3-30b-a3b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 120 $LOOM bench latency $D --output-json $R/qwen3-decode-shipped.json > $R/qwen3-decode-shipped.log 2>&1
echo "shipped: $(grep -E '^Decode' $R/qwen3-decode-shipped.log | head -1)"; stamp "qwen3 decode shipped"
LOOM_MOE_CONFIG_DIR=$R/cfg timeout $(left 540) $LOOM bench latency $D --profile --profile-result-dir $R/prof --output-json $R/qwen3-decode-new.json > $R/qwen3-decode-new.log 2>&1
echo "new: $(grep -E '^Decode' $R/qwen3-decode-new.log | head -1)"
python3 benchmarks/gpu/decode_steps.py $R/prof --json $R/qwen3-decode-steps.json --sequence 50 > $R/qwen3-decode-steps.txt
head -40 $R/qwen3-decode-steps.txt | cut -c1-150; echo ...; tail -14 $R/qwen3-decode-steps.txt
find $R -name 'trace-*.json' -size +20M -delete
tar czf $OUT/zz.tgz -C $R . ; stamp done
