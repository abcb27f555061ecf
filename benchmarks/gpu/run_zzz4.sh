# 1 GPU (~5 min), session 17. run_zzz3: in-process at 10 QPS (8B, 550 -> 150), 07a738d's
# prompt-carrying steps took a median 18.7 ms, this tree's 27.3 (22-39, growing with the
# requests beside the prompt). Suspects: the mixed step's two launches (6b28eb4, never timed)
# and FULL_AND_PIECEWISE's piece wrappers on eager steps. This tree, --no-async, with each off.
source benchmarks/gpu/env.sh
R=$OUT/zzz4; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
P=$PWD/benchmarks/gpu/serve_steps_probe.py
probe() {  # name deadline [probe flags...]
  local name=$1 deadline=$2; shift 2
  timeout $(left $deadline) python3 $P --seconds 10 --json $R/$name.json "$@" > $R/$name.log 2>&1
  grep -E '^\{|prompt steps' $R/$name.log | cut -c1-900; grep -iE "jit_watch|compiled a triton" $R/$name.log | head -3; stamp "$name"
}
probe default 100 --no-async
LOOM_MIXED_SPLIT_MIN_DECODES=1000000 probe nosplit 170 --no-async
probe fdo 240 --no-async --cudagraph-mode FULL_DECODE_ONLY
LOOM_MIXED_SPLIT_MIN_DECODES=1000000 probe nosplit-async 310
stamp done
