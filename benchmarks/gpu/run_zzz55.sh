# 1 GPU, session 29: (a) --enforce-eager with start-up now warming the decodes outside
# CUDA graphs: does any kernel still compile mid-run (run_zzz54 logged three)? fp8 and bf16
# caches, batch 16 after 4096-token prompts. (b) run_zzz53's question, per graph replay:
# where the batch-16 fp8 decode step's ~6.9 ms goes (-O 3, one profiled iteration, kernels
# of each replay and between replays, graph_steps.py), default splits against 3.
source benchmarks/gpu/env.sh; R=$OUT/zzz55; mkdir -p $R
B="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 4200 --input-len 4096 --batch-size 16"
for kv in fp8 auto; do
  timeout $(left 200) $LOOM bench latency $B --kv-cache-dtype $kv --output-len 64 --num-iters-warmup 0 --num-iters 1 --enforce-eager > $R/eager-$kv.log 2>&1
  echo "eager $kv rc $?"; grep -E "warm-up:|compiled while serving|Avg latency" $R/eager-$kv.log | cut -c1-600; stamp eager $kv
done
for t in new old; do
  [ $(left 520) -lt 60 ] && { echo "no time for $t"; break; }
  if [ $t = old ]; then export LOOM_DECODE_SPLITS=3; else unset LOOM_DECODE_SPLITS; fi
  timeout $(left 520) $LOOM bench latency $B --kv-cache-dtype fp8 --output-len 16 --num-iters-warmup 1 --num-iters 1 -O 3 --profile --profile-result-dir $R/prof-$t > $R/prof-$t.log 2>&1
  echo "$t rc $?"; grep -E "Avg latency|compiled while serving" $R/prof-$t.log | cut -c1-300
  python3 benchmarks/gpu/graph_steps.py $R/prof-$t --json $R/steps-$t.json | cut -c1-160; stamp $t
  rm -rf $R/prof-$t
done
tar czf $OUT/zzz55.tgz -C $R .
