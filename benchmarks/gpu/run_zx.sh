# 1 GPU (~3.5 min), session 12, with the last device time. Qwen3-30B-A3B throughput (1000 x
# 1024 -> 256) at this commit, with the held matmul rate beside the burst one (41.72 s,
# 4.71x the compute floor at ab4b373).
source benchmarks/gpu/env.sh
R=/tmp/zx; mkdir -p $R
T="--model qwen3-30b-a3b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
timeout 215 $LOOM bench throughput $T --output-json $R/qwen3-thr.json > $R/qwen3-thr.log 2>&1
grep -E "^(Throughput|Compute floor|Ceilings)|^  (decode only|with prompt|steps')" $R/qwen3-thr.log | cut -c1-220
tar czf $OUT/zx.tgz -C $R . ; stamp done
