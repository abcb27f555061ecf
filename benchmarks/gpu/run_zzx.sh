# 1 GPU (~4 min), session 16. Serving's steps in-process (serve_steps_probe.py, 10 QPS of
# 550 -> 150 tokens): this tree's default, then without piecewise graphs
# (FULL_DECODE_ONLY), without async scheduling, and without the decode GEMV. Results go
# straight to $OUT, each as it ends (the device budget may cut the last).
source benchmarks/gpu/env.sh
mkdir -p $OUT/zzx
run() { name=$1; shift; timeout 100 python3 benchmarks/gpu/serve_steps_probe.py "$@" --json $OUT/zzx/$name.json > $OUT/zzx/$name.log 2>&1
  grep -E "^\{|compiled while" $OUT/zzx/$name.log | cut -c1-700; stamp "$name"; }
run default
run full-decode-only --cudagraph-mode FULL_DECODE_ONLY
run no-async --no-async
LOOM_DECODE_GEMV=0 run no-gemv
