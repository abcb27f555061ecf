# x2: the fused all-reduce + norm (TP decode) and the fused rotary + KV write, checked and
# measured: kernel tests on CUDA (GPU0) beside 1-GPU decode (GPU1); the 2-GPU fused-op test;
# TP=2 decode with the fusion on and off; the gpu-marked e2e tests; then, if time is left,
# 8192-token TP=2 prefill profiles of "off" split at attention and as one graph (issue 5).
source benchmarks/gpu/env.sh
R=/tmp/i; mkdir -p $R
M8="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5"
TP2="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 -tp 2 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5"
( export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/kernels tests/worker/test_sampler_kernel_path.py tests/worker/test_fused_rope_path.py > $R/tests1.log 2>&1; echo "rc=$?" >> $R/tests1.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 120 $LOOM bench latency $M8 -O 3 --output-json $R/decode.json > $R/decode.log 2>&1 ) &
wait; stamp phase1; grep -E "passed|failed|rc=" $R/tests1.log | tail -3; grep -E "^Decode" $R/decode.log
timeout 90 python3 -m pytest -q -x -p no:cacheprovider tests/distributed/test_all_reduce_norm_gpu.py > $R/tests2.log 2>&1; echo "rc=$?" >> $R/tests2.log; tail -3 $R/tests2.log
timeout 120 $LOOM bench latency $TP2 -O 3 --output-json $R/tp2-decode.json > $R/tp2.log 2>&1; grep -E "^Decode|all_reduce_norm_fusion" $R/tp2.log | sort | uniq -c | head -5
timeout 120 $LOOM bench latency $TP2 -O '{"level":3,"pass_config":{"enable_all_reduce_norm_fusion":false}}' --output-json $R/tp2-decode-nofusion.json > $R/tp2-nofusion.log 2>&1; grep -E "^Decode" $R/tp2-nofusion.log
stamp decode
timeout 170 python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/e2e tests/distributed/test_tp.py > $R/tests3.log 2>&1; echo "rc=$?" >> $R/tests3.log; tail -3 $R/tests3.log
stamp tests
P="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 -tp 2 --input-len 8192 --output-len 1 --batch-size 1 --num-iters-warmup 2 --num-iters 2 --profile"
for V in split:'{"level":3,"compile_sizes":[8192],"cudagraph_capture_sizes":[]}' whole:'{"level":3,"compile_sizes":[8192],"cudagraph_capture_sizes":[],"splitting_ops":[]}'; do
  LEFT=$(( 560 - ($(date +%s) - T0) )); [ $LEFT -lt 60 ] && break
  timeout $LEFT $LOOM bench latency $P -O "${V#*:}" --profile-result-dir $R/prof-${V%%:*} > $R/prof-${V%%:*}.log 2>&1; grep -E "^Avg" $R/prof-${V%%:*}.log
  rm -f $R/prof-${V%%:*}/trace-rank1.json
done
tar czf $OUT/i.tgz -C $R . ; stamp done
