# 1 GPU (~8 min), session 13. The fused MoE at decode sizes (~62% of the copy rate at 512
# tokens; 46% of Qwen3-30B-A3B's decode steps) and the 8B decode steps' GEMMs (~61% of the
# matmul ceiling at ~484 rows, padded to 512).
# 1. The MoE GPU tests, with the transposed tiles (SWAP_AB) beside the tuned ones.
# 2. moe_probe.py: each kernel alone against the copy rate, tuned / best untransposed /
#    best transposed.
# 3. `loom bench moe --tune` at 1..1024 tokens (SWAP_AB now in its grid) into a copy of the
#    shipped table, then the shipped table and the new one timed in turn.
# 4. gemm_probe.py at 484 and 512 rows: cuBLAS against Inductor's max-autotune pick.
source benchmarks/gpu/env.sh
R=/tmp/zy; mkdir -p $R/cfg
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 90 python3 -m pytest -q -m gpu tests/kernels/test_fused_moe.py tests/kernels/test_fused_moe_configs.py > $R/tests.log 2>&1; tail -2 $R/tests.log; stamp tests
timeout 200 python3 benchmarks/gpu/moe_probe.py --rows 1 8 128 512 1024 16384 --json $R/moe-probe.json > $R/moe-probe.log 2>&1
grep -v "^  skipped" $R/moe-probe.log | cut -c1-200; stamp probe
cp loom/kernels/configs/E=128*.json $R/cfg/
B="1 2 4 8 16 32 64 128 256 512 1024"
timeout 180 $LOOM bench moe --tune --batch-sizes $B --save-dir $R/cfg --output-json $R/tune.json > $R/tune.log 2>&1
grep -E "^(M=|compiled|Wrote)" $R/tune.log | cut -c1-200; stamp tune
timeout 40 $LOOM bench moe --batch-sizes $B --output-json $R/shipped.json > $R/shipped.log 2>&1
LOOM_MOE_CONFIG_DIR=$R/cfg timeout 40 $LOOM bench moe --batch-sizes $B --output-json $R/new.json > $R/new.log 2>&1
paste <(grep "^M=" $R/shipped.log | awk '{print $2, $(NF-7)}') <(grep "^M=" $R/new.log | awk '{print $(NF-7)}'); stamp "shipped vs new"
timeout $(left 560) python3 benchmarks/gpu/gemm_probe.py --rows 484 512 --seconds 0 --max-autotune > $R/gemm.log 2>&1
grep -E "^(ceilings|M=)" $R/gemm.log | cut -c1-220
tar czf $OUT/zy.tgz -C $R . ; stamp done
