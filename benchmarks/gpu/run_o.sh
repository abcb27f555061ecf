# x2 (~8.5 min): where the TP=2 prefill's time goes.
# 1. Host side: a 2048-token (static) and a 128-token (dynamic) prefill under cProfile on both
#    ranks (--profile-host): 2048 is host-bound and jitters 33-58 ms between iterations.
#    Start-up now ends with gc.freeze(); 2048 off/on once more, beside the figures of run_l.
# 2. 8192 with async TP under torch.profiler: the partials' sum was folded into the norm,
#    but the step moved 122.0 -> 121.1 ms, not to the ~118 expected.
# 3. The dynamic path (no compile_sizes), 2048 and 8192, off/on once each.
source benchmarks/gpu/env.sh
R=/tmp/o; mkdir -p $R
B="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 -tp 2 --output-len 1 --batch-size 1 --num-iters-warmup 5 --num-iters 15"
AT=',"pass_config":{"enable_async_tp":true}'
timeout 100 $LOOM bench latency $B --input-len 2048 -O '{"level":3,"compile_sizes":[2048],"cudagraph_capture_sizes":[]}' --profile-host --profile-result-dir $R/host2048 --output-json $R/s2048-off-a.json > $R/s2048-off-a.log 2>&1
echo "2048 off (host profile): $(grep -E '^Avg' $R/s2048-off-a.log)"
timeout 90 $LOOM bench latency $B --input-len 128 -O '{"level":3,"cudagraph_capture_sizes":[]}' --profile-host --profile-result-dir $R/host128 --output-json $R/d128-off.json > $R/d128-off.log 2>&1
echo "128 dynamic off (host profile): $(grep -E '^Avg' $R/d128-off.log)"
timeout 90 $LOOM bench latency $B --input-len 2048 -O "{\"level\":3,\"compile_sizes\":[2048],\"cudagraph_capture_sizes\":[]$AT}" --output-json $R/s2048-on-a.json > $R/s2048-on-a.log 2>&1
echo "2048 on: $(grep -E '^Avg' $R/s2048-on-a.log)"
stamp host
timeout 130 $LOOM bench latency $B --input-len 8192 -O "{\"level\":3,\"compile_sizes\":[8192],\"cudagraph_capture_sizes\":[]$AT}" --profile --profile-result-dir $R/prof8192on --output-json $R/s8192-on-p.json > $R/s8192-on-p.log 2>&1
echo "8192 on (then profiled): $(grep -E '^Avg' $R/s8192-on-p.log)"
rm -f $R/prof8192on/trace-rank1.json
stamp profile
LEFT=$(( 560 - ($(date +%s) - T0) ))
timeout $LEFT $LOOM bench async-tp --model llama-3.1-8b -tp 2 --input-lens 2048,8192 --graphs dynamic --repeats 1 --result-dir $R/dyn -- --load-format dummy --no-enable-prefix-caching --max-model-len 9000 > $R/dyn.log 2>&1
grep -E "tokens, dynamic" $R/dyn.log
tar czf $OUT/o.tgz -C $R . ; stamp done
