# 1 GPU (~6 min), session 31: eager attention without the dispatcher, host-side cdiv (933a24a)
# against session 30's tree (3d3c547, an untracked copy in .base/: `git archive 3d3c547 loom |
# tar x -C .base`), alternated: 8B batch-1 decode 128 -> 32 under --enforce-eager and under
# PIECEWISE, and the 128-token prompt step alone (--output-len 1) under the default; then
# launch_cost.py on this tree.
source benchmarks/gpu/env.sh; R=$OUT/zzz67; mkdir -p $R
L="--model llama-3.1-8b --load-format dummy --input-len 128 --num-iters-warmup 2 --num-iters 4 --batch-size 1"
run() {  # tree (base|new), name, flags...
  local tree=$1 name=$2; shift 2
  [ $(left 480) -lt 50 ] && { echo "no time for $tree $name"; return; }
  local pp=/tmp/site:$PWD; [ $tree = base ] && pp=/tmp/site:$PWD/.base
  PYTHONPATH=$pp timeout $(left 500) $LOOM bench latency $L "$@" --output-json $R/$name-$tree.json > $R/$name-$tree.log 2>&1
  echo "$tree $name rc $? $(grep -E '^Avg|^Decode' $R/$name-$tree.log | cut -c1-48 | tr '\n' ' ')"
}
for t in base new; do run $t eager --output-len 32 --enforce-eager; done
for t in base new; do run $t pw --output-len 32 -O.cudagraph_mode=PIECEWISE; done
i=0; for t in base new new base; do i=$((i+1)); run $t prefill$i --output-len 1; done
stamp latency
timeout $(left 560) python3 benchmarks/gpu/launch_cost.py 2>&1 | grep -v Warn > $R/launch_cost.log; cat $R/launch_cost.log; stamp launch_cost
