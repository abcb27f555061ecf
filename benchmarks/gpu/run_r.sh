# x2 (~9.5 min), next session's first call: what was built without a GPU in session 6.
# 0. LOOM_ASYNC_TP_IMPL=p2p (loom/distributed/p2p_matmul.py): its GPU test (TP=2 tokens equal
#    TP=1), then 8192 async TP with it beside the default symm_mem (118.2 ms at 51c1b80,
#    off 128.0): one barrier a call instead of three, less host time per op.
# 1. GPU tests: piecewise CUDA graphs (cudagraph_mode FULL_AND_PIECEWISE, opt-in), greedy
#    tokens equal to the default mode at TP=1 and TP=2 (NCCL captured).
# 2. TP=2 2048 static, passes off: default against FULL_AND_PIECEWISE, interleaved twice.
#    Expected: the host-bound ~33/50 ms bimodal step becomes GPU-bound (~28-30 ms, steady).
# 3. TP=2 8192 static off with FULL_AND_PIECEWISE (128.0 ms default at 51c1b80; async TP
#    118.2 compiles one whole graph, which keeps attention inside and is not captured).
# 4. 1 GPU (GPU0): prefill 8192 and 2048, default against FULL_AND_PIECEWISE (#3's targets:
#    85% and 75% of the matmul ceiling; 79.1% and 78.8% at f1214a8).
# Every run logs LOOM_LAYER_TIMES lines (host vs GPU time per layer, no profiler); the last
# step's line is printed: is the 8192 async-TP step host-bound between its fused ops?
source benchmarks/gpu/env.sh
export LOOM_LAYER_TIMES=1
R=/tmp/r; mkdir -p $R
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/compilation/test_level3.py tests/worker/test_layer_clock.py tests/compilation/test_tp2_passes.py -k "p2p or piecewise or layer_times" > $R/tests.log 2>&1; echo "rc=$?" >> $R/tests.log; tail -2 $R/tests.log
stamp tests
B="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --output-len 1 --batch-size 1 --num-iters-warmup 5 --num-iters 15"
run() {  # name tp len mode
  LEFT=$(( 570 - ($(date +%s) - T0) )); [ $LEFT -lt 50 ] && { echo "$1: skipped for time"; return; }
  timeout $LEFT $LOOM bench latency $B -tp $2 --input-len $3 -O "{\"level\":3,\"compile_sizes\":[$3],\"cudagraph_capture_sizes\":[],\"cudagraph_mode\":\"$4\"}" --output-json $R/$1.json > $R/$1.log 2>&1
  echo "$1: $(grep -E '^Avg' $R/$1.log) $(grep -E '^Prefill' $R/$1.log | cut -c1-90) $(grep -c 'could not be captured' $R/$1.log) capture failures"
  grep "layer times: $3 tokens" $R/$1.log | tail -${2} | sed 's/^/    /'
}
runon() {  # name len: async TP on (one whole graph)
  LEFT=$(( 570 - ($(date +%s) - T0) )); [ $LEFT -lt 70 ] && { echo "$1: skipped for time"; return; }
  timeout $LEFT $LOOM bench latency $B -tp 2 --input-len $2 -O "{\"level\":3,\"compile_sizes\":[$2],\"cudagraph_capture_sizes\":[],\"pass_config\":{\"enable_async_tp\":true}}" --output-json $R/$1.json > $R/$1.log 2>&1
  echo "$1: $(grep -E '^Avg' $R/$1.log)"
  grep "layer times: $2 tokens" $R/$1.log | tail -2 | sed 's/^/    /'
}
LOOM_ASYNC_TP_IMPL=p2p runon tp2-s8192-on-p2p 8192
runon tp2-s8192-on 8192
for rep in 1 2; do
  run tp2-s2048-default$rep 2 2048 FULL_DECODE_ONLY
  run tp2-s2048-piecewise$rep 2 2048 FULL_AND_PIECEWISE
done
run tp2-s8192-piecewise 2 8192 FULL_AND_PIECEWISE
stamp tp2
export CUDA_VISIBLE_DEVICES=0
for L in 8192 2048; do
  run tp1-s$L-default 1 $L FULL_DECODE_ONLY
  run tp1-s$L-piecewise 1 $L FULL_AND_PIECEWISE
done
tar czf $OUT/r.tgz -C $R . ; stamp done
