# 1 GPU (~9 min), session 31: fast_launch (loom/kernels/launch.py) and the attention op called
# without the dispatcher. GPU tests first (fast_launch's specializations against torch; the
# tiny models on the GPU against the CPU, eager, default and PIECEWISE; bf16 against
# transformers). Then host_ab.py (before and now, alternated in one process), then 8B
# batch-1 decode under --enforce-eager (128 -> 32) and the 128-token prompt step alone
# (default, --output-len 1), 3d3c547 (.base/, `git archive 3d3c547 loom | tar x -C .base`)
# against this tree, alternated.
source benchmarks/gpu/env.sh; R=$OUT/zzz68; mkdir -p $R
timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_fast_launch.py tests/e2e/test_gpu.py \
  -k "fast or (equals_cpu and (eager or default or piecewise)) or transformers" > $R/tests.log 2>&1
echo "gpu tests rc $?"; tail -3 $R/tests.log; stamp tests
timeout 120 python3 benchmarks/gpu/host_ab.py 2>&1 | grep -v Warn | tee $R/host_ab.log; stamp host_ab
L="--model llama-3.1-8b --load-format dummy --input-len 128 --num-iters-warmup 2 --num-iters 5 --batch-size 1"
run() {  # tree (base|new), name, flags...
  local tree=$1 name=$2; shift 2
  [ $(left 540) -lt 45 ] && { echo "no time for $tree $name"; return; }
  local pp=/tmp/site:$PWD; [ $tree = base ] && pp=/tmp/site:$PWD/.base
  PYTHONPATH=$pp timeout $(left 555) $LOOM bench latency $L "$@" --output-json $R/$name-$tree.json > $R/$name-$tree.log 2>&1
  echo "$tree $name rc $? $(grep -E '^Avg|^Decode' $R/$name-$tree.log | cut -c1-48 | tr '\n' ' ')"
}
i=0; for t in base new new base; do i=$((i+1)); run $t eager$i --output-len 32 --enforce-eager; done
i=0; for t in new base base new; do i=$((i+1)); run $t prefill$i --output-len 1; done
stamp latency
rm -f $R/*.log.tmp; tar czf $OUT/zzz68.tgz -C $R .
