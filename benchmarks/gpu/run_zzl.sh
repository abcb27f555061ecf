# 1 GPU (~7 min), session 15. Where Qwen3-30B-A3B's prompt steps lose their time: they ran
# 2.23-2.44x their floor (8B's ran 1.38x), ~310 ms each for 16384 prompt tokens + ~394
# decodes, and none has been profiled yet (session 11's steps 40-42 were decode steps).
# 1. Qwen3 throughput with steps 20-21 (prompt steps of the first wave) under the profiler;
# 2. the fused MoE at 16384 rows: the tuned config, the tuner's whole grid at that size,
#    and torch._grouped_mm (CUTLASS's grouped GEMM) at the same shapes as a peer.
source benchmarks/gpu/env.sh
R=/tmp/zzl; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
T="--load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
timeout 240 $LOOM bench throughput --model qwen3-30b-a3b $T --profile-steps 20 2 --profile-result-dir $R/prof-qwen3-prompt --output-json $R/qwen3-prompt-prof.json > $R/qwen3-prompt-prof.log 2>&1
grep -v "Processed prompts" $R/qwen3-prompt-prof.log | grep -v -E "^(INFO|DEBUG)" | cut -c1-200 | head -60; stamp "qwen3 throughput, prompt steps profiled"
timeout $(left 540) python3 benchmarks/gpu/moe_probe.py --rows 4096 16384 --search-up-to 16384 --json $R/moe-probe.json > $R/moe-probe.log 2>&1
grep -v -E "^  skipped" $R/moe-probe.log | tail -30; stamp "moe probe"
tar czf $OUT/zzl.tgz -C $R . ; stamp done
