# 1 GPU (~4 min), written in session 51 for the next session: a verify's attention alone
# (`loom bench attention --mode verify`: B queries of 1 + k tokens after a context, the
# split-K decode kernel at q_tokens beside the varlen launch it replaced), at Llama-3.1-8B's
# heads (groups of 4) and Qwen3-30B-A3B's (groups of 8), k = 4 and 7. End to end
# (run_zzz122/123, H100): 0.71x-0.73x a step after 4096 tokens, 0.95x-1.00x after 128.
# Where the varlen launch still wins (wide batches at short contexts?), the backend's
# SHORT_QUERY bounds are the change to make.
source benchmarks/gpu/env.sh; R=/tmp/zzz126; mkdir -p $R
A="--mode verify --batch-sizes 1 8 32 --context-lens 128 1024 4096 8192 --num-iters 20"
for m in llama-3.1-8b qwen3-30b-a3b; do
  for q in 5 8; do
    timeout $(left $(( 100 * (1 + $(ls $R | grep -c json)) ))) $LOOM bench attention --model $m $A \
      --query-len $q --output-json $R/verify-$m-q$q.json > $R/verify-$m-q$q.log 2>&1
    echo "$m q=$q rc $?"; grep -E "B=|single launch" $R/verify-$m-q$q.log | cut -c1-170 | head -24
    pack verify-$m-q$q.log verify-$m-q$q.json
  done
done
stamp done
