# 1 GPU, session 29. (a) --enforce-eager, fp8 cache, batch 16 after 4096-token prompts, one
# cold iteration: the former code (baeaa9c, carried in old29/) first, so that its mid-run
# compiles meet a cold Triton cache, then this commit, whose warm-up compiles the decodes
# outside CUDA graphs (run_zzz55: none mid-run). (b) run_zzz55's profiles again, each graph
# kind apart (graph_steps.py now groups replays by kernel count): default splits against 3.
source benchmarks/gpu/env.sh; R=$OUT/zzz56; mkdir -p $R
B="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 4200 --input-len 4096 --batch-size 16 --kv-cache-dtype fp8"
for t in old new; do
  D=$PWD; [ $t = old ] && D=$PWD/old29  # python -m imports loom from the working directory
  (cd $D && PYTHONPATH=/tmp/site:$D timeout $(left 200) $LOOM bench latency $B --output-len 64 --num-iters-warmup 0 --num-iters 1 --enforce-eager) > $R/eager-$t.log 2>&1
  echo "eager $t rc $?"; grep -E "warm-up:|compiled while serving|Avg latency" $R/eager-$t.log | cut -c1-300; stamp eager $t
done
for t in new old; do
  [ $(left 420) -lt 60 ] && { echo "no time for $t"; break; }
  if [ $t = old ]; then export LOOM_DECODE_SPLITS=3; else unset LOOM_DECODE_SPLITS; fi
  timeout $(left 420) $LOOM bench latency $B --output-len 16 --num-iters-warmup 1 --num-iters 1 -O 3 --profile --profile-result-dir $R/prof-$t > $R/prof-$t.log 2>&1
  echo "$t rc $?"; grep -E "Avg latency|compiled while serving" $R/prof-$t.log | cut -c1-300
  python3 benchmarks/gpu/graph_steps.py $R/prof-$t --top 14 --json $R/steps-$t.json | head -36 | cut -c1-150; stamp $t
  rm -rf $R/prof-$t
done
tar czf $OUT/zzz56.tgz -C $R .
