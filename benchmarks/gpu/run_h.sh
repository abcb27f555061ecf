# x2: async TP at 8192 tokens (issue 5), every variant interleaved twice, then a profile of the
# best "on" variant: off (split at attention), off as one graph, sequence parallelism alone,
# on per the table (reduce-scatters fused), on with the all-gathers fused too.
source benchmarks/gpu/env.sh
R=/tmp/h; mkdir -p $R
B="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 -tp 2 --input-len 8192 --output-len 1 --batch-size 1 --num-iters-warmup 5 --num-iters 15"
one() {  # name env -O
  timeout 150 env $2 $LOOM bench latency $B -O "$3" --output-json $R/$1.json > $R/$1.log 2>&1
  echo "$1: $(grep -E '^Avg latency' $R/$1.log) $(grep -ohE '(sequence_parallelism|async_tp): 8192 tokens: [a-z]+ [0-9]+ of [0-9]+ [a-z_+]+(, [0-9]+ of [0-9]+ [a-z_+]+)?' $R/$1.log | sort -u | tr '\n' ' ')"
}
OFF='{"level":3,"compile_sizes":[8192],"cudagraph_capture_sizes":[]}'
WHOLE='{"level":3,"compile_sizes":[8192],"cudagraph_capture_sizes":[],"splitting_ops":[]}'
SP='{"level":3,"compile_sizes":[8192],"cudagraph_capture_sizes":[],"pass_config":{"enable_sequence_parallelism":true}}'
ON='{"level":3,"compile_sizes":[8192],"cudagraph_capture_sizes":[],"pass_config":{"enable_async_tp":true}}'
for rep in 1 2; do
  one off$rep X=1 "$OFF"
  one on$rep X=1 "$ON"
  one onag$rep LOOM_ASYNC_TP_MIN_TOKENS=8192 "$ON"
  [ $rep = 1 ] && one whole$rep X=1 "$WHOLE" && one sp$rep X=1 "$SP"
  stamp rep$rep
done
timeout $(( 590 - ($(date +%s) - T0) )) env LOOM_ASYNC_TP_MIN_TOKENS=8192 $LOOM bench latency $B --num-iters-warmup 3 --num-iters 3 -O "$ON" --profile --profile-result-dir $R/prof > $R/prof.log 2>&1; grep -E "^Avg" $R/prof.log
rm -f $R/prof/trace-rank1.json
tar czf $OUT/h.tgz -C $R . ; stamp done
