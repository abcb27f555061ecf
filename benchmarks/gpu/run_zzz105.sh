# 2 GPUs (nvidia-h200-x2 or nvidia-h100-x2; ~9 min), session 44: `loom serve -dp 2` on one
# host. The same 8B-shaped server (dummy weights) with -dp 1 and with -dp 2, each driven by
# `loom bench serve` (random 512 -> 128 tokens, ignore_eos, every request at once): -dp 2's
# output tokens/s over -dp 1's, measured beside it (ideal 2.0: each replica has its own GPU
# and ZeroMQ sockets; the API process is shared). Also: which GPU each replica's engine took
# (nvidia-smi's processes), and the server's /metrics running gauge during the run.
source benchmarks/gpu/env.sh; R=$OUT/zzz105; mkdir -p $R
nvidia-smi -L | tee $R/gpus.txt
S="--model llama-3.1-8b --load-format dummy --max-model-len 2048 --port 8011 --disable-log-stats"
B="--port 8011 --model llama-3.1-8b --dataset-name random --random-input-len 512 \
  --random-output-len 128 --ignore-eos --seed 0 --save-result"
for dp in 1 2; do
  [ $(left 560) -lt 120 ] && { echo "no time for dp$dp"; continue; }
  setsid $LOOM serve $S -dp $dp > $R/serve-dp$dp.log 2>&1 & pid=$!
  for i in $(seq 1 240); do curl -sf localhost:8011/health > /dev/null && break; sleep 1; done
  echo "dp$dp ready after ${i} s"; stamp "dp$dp ready"
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv > $R/apps-dp$dp.csv
  n=$(( 256 * dp ))
  timeout $(left 570) $LOOM bench serve $B --num-prompts $n --result-dir $R \
    --result-filename dp$dp.json > $R/bench-dp$dp.log 2>&1
  echo "bench dp$dp rc $? $(grep -E 'Output token throughput|Request throughput' $R/bench-dp$dp.log | tr '\n' ' ')"
  curl -s localhost:8011/metrics | grep -E "^loom:num_requests_(running|waiting)" | head -4
  kill -INT -$pid; wait $pid; echo "dp$dp stop rc $?"; sleep 3; stamp "dp$dp done"
done
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz105.tgz -C $R .
