# 1 GPU (~9 min), session 15. The fused MoE's grouped GEMM through TMA descriptors (weights,
# and down's activations) at prompt sizes, where it ran ~60% of the matmul rate (run_zzl:
# gate_up 1547 us = 533 TFLOP/s, down 870 us = 474 at 16384 tokens; CUTLASS's grouped GEMM
# 641 / 484 on the same shapes, before the gather it would need):
# 1. the GPU tests of the fused MoE (a TMA config among them);
# 2. moe_probe at 4096 and 16384 rows: every tile of the tuner's grid with and without TMA;
# 3. `loom bench moe --tune` at 2048-16384 tokens, TMA in its grid, into a copy of the tables;
# 4. Qwen3 throughput with the shipped tables, then with the new ones (step breakdown, now
#    naming the slowest steps: is a prompt step slow throughout, or are a few very slow?).
source benchmarks/gpu/env.sh
R=/tmp/zzm; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 90 python3 -m pytest -q -m gpu tests/kernels/test_fused_moe.py > $R/tests-moe.log 2>&1
tail -3 $R/tests-moe.log; stamp "moe gpu tests"
timeout 120 python3 benchmarks/gpu/moe_probe.py --rows 4096 16384 --search-up-to 16384 --json $R/moe-probe.json > $R/moe-probe.log 2>&1
grep -v -E "^  skipped" $R/moe-probe.log | tail -22; stamp "moe probe"
cp -r loom/kernels/configs $R/cfg
timeout 150 $LOOM bench moe --model qwen3-30b-a3b --tune --batch-sizes 2048 4096 8192 16384 --save-dir $R/cfg --output-json $R/tune.json > $R/tune.log 2>&1
grep -E "^(M=|compiled|Wrote)|batch sizes in" $R/tune.log | cut -c1-220 | tail -12; stamp "moe tune 2048-16384"
T="--model qwen3-30b-a3b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
timeout $(left 420) $LOOM bench throughput $T --output-json $R/qwen3-thr-shipped.json > $R/qwen3-thr-shipped.log 2>&1
grep -E "^(Throughput|  |Compute floor)" $R/qwen3-thr-shipped.log | cut -c1-240; stamp "qwen3 throughput, shipped tables"
LOOM_MOE_CONFIG_DIR=$R/cfg timeout $(left 585) $LOOM bench throughput $T --output-json $R/qwen3-thr-tma.json > $R/qwen3-thr-tma.log 2>&1
grep -E "^(Throughput|  |Compute floor)" $R/qwen3-thr-tma.log | cut -c1-240; stamp "qwen3 throughput, new tables"
tar czf $OUT/zzm.tgz -C $R . ; stamp done
