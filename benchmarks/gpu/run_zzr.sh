# 1 GPU (~4.5 min), session 15. The engine's collector thresholds after start-up: Python's
# (700, 10, 10) against loom's new default (50000, 20, 100). run_zzp: ~2100 young and ~17
# full collections a run, 2 s; each full one traverses every request's token lists.
# 8B throughput twice in one call, Python's thresholds first.
source benchmarks/gpu/env.sh
R=/tmp/zzr; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
LOOM_GC_THRESHOLDS=700,10,10 timeout 150 $LOOM bench throughput $T --output-json $R/thr-8b-gc-python.json > $R/thr-8b-gc-python.log 2>&1
grep -E "^(Throughput|  |Compute floor)" $R/thr-8b-gc-python.log | grep -v "full collection walked" | cut -c1-300; stamp "8b, python's gc thresholds"
timeout $(left 270) $LOOM bench throughput $T --output-json $R/thr-8b-gc-loom.json > $R/thr-8b-gc-loom.log 2>&1
grep -E "^(Throughput|  |Compute floor)" $R/thr-8b-gc-loom.log | grep -v "full collection walked" | cut -c1-300; stamp "8b, loom's gc thresholds"
tar czf $OUT/zzr.tgz -C $R . ; stamp done
