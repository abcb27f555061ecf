# 1 GPU (~6 min), session 34: where start-up goes. At 6a54a0b an 8B server took ~45 s from
# its weights to ready (run_zzz78): torch.compile 9.9 s, the warm-up's step shapes 11-12 s
# (on a warm Triton cache too), the decode graphs' capture 12.1 s (batch 4 alone 3.55 s).
# `bench latency` (in-process engine) under cProfile on cold caches, again warm, then warm
# without the profiler and with Dynamo's recompiles logged; each profile as text.
# Found: the long warm-ups were Triton's cold compiles (run_zzz78's servers on warm caches
# took 0.8 s), not warm-cache work; docs/performance.md, session 34.
source benchmarks/gpu/env.sh; R=$OUT/zzz79; mkdir -p $R
L="bench latency --model llama-3.1-8b --load-format dummy --input-len 128 --output-len 2 --batch-size 1 --num-iters-warmup 1 --num-iters 2"
for name in cold warm; do
  s=$(date +%s)
  timeout $(left 420) python3 -m cProfile -o $R/$name.prof -m loom.cli $L > $R/$name.log 2>&1
  echo "$name: rc $? $(( $(date +%s) - s )) s"; stamp $name
done
s=$(date +%s)
TORCH_LOGS=recompiles,graph_breaks timeout $(left 540) $LOOM $L > $R/plain.log 2>&1
echo "plain: rc $? $(( $(date +%s) - s )) s"; stamp plain
for name in cold warm; do
  python3 - $R/$name.prof > $R/$name.txt <<'PY'
import pstats, sys
p = pstats.Stats(sys.argv[1])
p.sort_stats("cumulative").print_stats(120)
p.sort_stats("tottime").print_stats(50)
PY
done
grep -E "^(INFO|WARNING)" $R/warm.log | cut -c1-220
tar czf $OUT/zzz79.tgz -C $R --exclude='*.prof' .
