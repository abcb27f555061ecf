# 1 GPU (~9 min), session 32: fast_launch (LOOM_FAST_LAUNCH=1, Triton 3.6's empty hook chains
# recognised) and eager CUDA norms as loom's Triton add + norm kernel. GPU tests with the flag
# on: fast_launch's specializations against torch; the tiny models on the GPU against the CPU
# in float32 (eager, level 0 with CUDA graphs, default, PIECEWISE), bf16 against
# transformers. Then host_ab.py (before and now, alternated in one process). Then 8B batch-1
# decode under --enforce-eager (128 -> 32), alternated: base = d11b7db (.base/, torch norms,
# Triton's launch), new with LOOM_FAST_LAUNCH=0 (Triton norms only) and =1 (both).
source benchmarks/gpu/env.sh; R=$OUT/zzz70; mkdir -p $R
LOOM_FAST_LAUNCH=1 timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_fast_launch.py tests/e2e/test_gpu.py \
  -k "fast or (equals_cpu and (eager or level0 or default or piecewise)) or transformers" > $R/tests.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed|FAIL|Error" $R/tests.log | tail -8; stamp tests
timeout 150 python3 benchmarks/gpu/host_ab.py 2>&1 | grep -v Warn | tee $R/host_ab.log; stamp host_ab
L="--model llama-3.1-8b --load-format dummy --input-len 128 --output-len 32 --num-iters-warmup 2 --num-iters 5 --batch-size 1 --enforce-eager"
run() {  # tree (base|new0|new1), name
  local tree=$1 name=$2
  [ $(left 545) -lt 45 ] && { echo "no time for $tree $name"; return; }
  local pp=/tmp/site:$PWD fl=${tree#new}; [ $tree = base ] && { pp=/tmp/site:$PWD/.base; fl=0; }
  LOOM_FAST_LAUNCH=$fl PYTHONPATH=$pp timeout $(left 558) $LOOM bench latency $L --output-json $R/$name-$tree.json > $R/$name-$tree.log 2>&1
  echo "$tree $name rc $? $(grep -E '^Avg|^Decode' $R/$name-$tree.log | cut -c1-48 | tr '\n' ' ')"
}
i=0; for t in base new1 new0 new1 base new0 new1 base; do i=$((i+1)); run $t eager$i; done
stamp latency
tar czf $OUT/zzz70.tgz -C $R .
