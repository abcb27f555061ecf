# x2, first call of the next session (~9 min): everything written after the last GPU run.
# 1. GPU tests: the fused all-reduce + norm (2 GPUs), kernels on CUDA, and the gpu-marked
#    compilation tests (async TP greedy tokens equal without it: runs the new
#    loom::matmul_reduce_scatter_partials exchange for real).
# 2. TP=2 decode: the fusion's range split (afb63c6) should keep decode at ~3.13 ms/token and
#    bring the 128-token prefill, avg(1), back to ~40 ms (53 ms at 936deda).
# 3. Async TP at 8192 (the partials' sum folded into the norm; expected ~118 ms against
#    ~128.7 off, from 122.0), off/on interleaved twice, then 2048 off/on once (identical
#    graphs by the table: never slower).
source benchmarks/gpu/env.sh
R=/tmp/l; mkdir -p $R
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/distributed/test_all_reduce_norm_gpu.py tests/kernels/test_all_reduce_norm_kernel.py tests/kernels/test_rope_kv_write.py > $R/tests1.log 2>&1; echo "rc=$?" >> $R/tests1.log; tail -2 $R/tests1.log
timeout 150 python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/compilation > $R/tests2.log 2>&1; echo "rc=$?" >> $R/tests2.log; tail -2 $R/tests2.log
stamp tests
timeout 90 $LOOM bench latency --model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 -tp 2 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3 --output-json $R/tp2-decode.json > $R/tp2.log 2>&1
grep -E "^Decode|^Prefill" $R/tp2.log
B="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 -tp 2 --output-len 1 --batch-size 1 --num-iters-warmup 5 --num-iters 15"
for rep in 1 2; do for M in off on; do
  [ $M = on ] && P=',"pass_config":{"enable_async_tp":true}' || P=''
  timeout 120 $LOOM bench latency $B --input-len 8192 -O "{\"level\":3,\"compile_sizes\":[8192],\"cudagraph_capture_sizes\":[]$P}" --output-json $R/s8192-$M$rep.json > $R/s8192-$M$rep.log 2>&1
  echo "8192 $M$rep: $(grep -E '^Avg' $R/s8192-$M$rep.log)"
done; done
for M in off on; do
  [ $M = on ] && P=',"pass_config":{"enable_async_tp":true}' || P=''
  LEFT=$(( 585 - ($(date +%s) - T0) )); [ $LEFT -lt 50 ] && break
  timeout $LEFT $LOOM bench latency $B --input-len 2048 -O "{\"level\":3,\"compile_sizes\":[2048],\"cudagraph_capture_sizes\":[]$P}" --output-json $R/s2048-$M.json > $R/s2048-$M.log 2>&1
  echo "2048 $M: $(grep -E '^Avg' $R/s2048-$M.log)"
done
tar czf $OUT/l.tgz -C $R . ; stamp done
