# 1 GPU (~2 min), session 15. gc_probe.py: what the collector finds while a tiny Llama is
# served with the GPU defaults (run_zzp: full collections of ~20k objects took 60-120 ms).
source benchmarks/gpu/env.sh
R=/tmp/zzq; mkdir -p $R
timeout 200 python3 benchmarks/gpu/gc_probe.py --json $R/gc-probe.json > $R/gc-probe.log 2>&1
grep -v -E "^(INFO|DEBUG)|Warn|warn" $R/gc-probe.log | tail -60; stamp "gc probe"
tar czf $OUT/zzq.tgz -C $R . ; stamp done
