# 1 GPU (~6 min), session 17. The served 10 QPS TTFT at 07a738d beats this tree's by 14-48 ms
# in every call (run_zzw, zzz, zzz2), the gap mostly in the engine's prefill time. Do the
# engine's own steps differ? serve_steps_probe.py (public engine calls only) on both trees,
# in this process: --no-async times each step; async gives the TTFT as served. Then this
# tree's eagerly run steps with LOOM_LAYER_TIMES=1: host against GPU time per layer.
source benchmarks/gpu/env.sh
R=$OUT/zzz3; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
P=$PWD/benchmarks/gpu/serve_steps_probe.py
probe() {  # name dir deadline [probe flags...]
  local name=$1 dir=$2 deadline=$3; shift 3
  (cd $dir && timeout $(left $deadline) python3 $P --seconds 10 --json $R/$name.json "$@" > $R/$name.log 2>&1)
  grep -E '^\{|prompt steps' $R/$name.log | cut -c1-600; stamp "$name"
}
probe head-noasync . 100 --no-async
probe old07-noasync old07 190 --no-async
probe head-async . 260
probe old07-async old07 340
LOOM_LAYER_TIMES=1 probe head-layers . 420 --no-async
grep "layer times" $R/head-layers.log | sed 's/.*layer times: //' | sort -t' ' -k1,1n | uniq -c | sort -rn | head -5
grep "layer times" $R/head-layers.log | grep -E "^.*layer times: 5[0-9]{2} " | head -3
grep "layer times" $R/head-layers.log | awk '{print $0}' | grep -E "layer times: [0-9]+ tokens" | awk -F'layer times: ' '{print $2}' | awk '$1 > 500' | head -8
stamp done
