# x2 (~9.5 min), issue 4's decode (3.130 ms/token at 1d431a8; goal 2.6) and piecewise memory.
# 1. The piecewise GPU tests (their new log line: pieces captured, GPU memory reserved).
# 2. TP=2 decode 128 -> 128 at HEAD, one more iteration under torch.profiler: each rank's
#    ops by device time, for the current split (GEMMs, one-shot all-reduce + norm, attention
#    split + reduce, split-K reduces, small kernels) against eb80c49's.
# 3. The same with cuBLASLt preferred (TORCH_BLAS_PREFER_CUBLASLT=1): does it drop the
#    split-K reduce kernels (107 us a step at eb80c49)? And with LOOM_AR_NORM_PUSH=1 (the
#    fused all-reduce + norm pushes its row into the peers' buffers: no remote read on the
#    critical path of its 64 calls a token), after its GPU test.
# 4. Piecewise graphs: TP=2 prefill 8192 (static) for the graphs' memory line; a 128-token
#    TP=2 prefill with no compile_sizes, default against FULL_AND_PIECEWISE (padded to 128,
#    the general graph's pieces replayed; 38.3 ms at 1d431a8, host-bound).
source benchmarks/gpu/env.sh
R=/tmp/w; mkdir -p $R
timeout -s INT 130 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short -m gpu tests/compilation/test_level3.py -k piecewise_graphs_on_gpu > $R/tests.log 2>&1; echo "rc=$?" >> $R/tests.log
grep -E "^(FAILED|ERROR|E  )|passed|failed|rc=" $R/tests.log | tail -12
timeout -s INT 60 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short -m gpu tests/distributed/test_all_reduce_norm_gpu.py > $R/tests-push.log 2>&1; echo "rc=$?" >> $R/tests-push.log
grep -E "^(FAILED|ERROR|E  )|passed|failed|rc=" $R/tests-push.log | tail -6
stamp tests
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 -tp 2 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 150 $LOOM bench latency $D --profile --profile-result-dir $R/prof --output-json $R/tp2-decode.json > $R/tp2-decode.log 2>&1
grep -E "^Decode|^All-reduce" $R/tp2-decode.log
grep -q "push.*PASSED\|2 passed" $R/tests-push.log && { LOOM_AR_NORM_PUSH=1 timeout 100 $LOOM bench latency $D --output-json $R/tp2-decode-push.json > $R/tp2-decode-push.log 2>&1; echo "push: $(grep -E '^Decode' $R/tp2-decode-push.log)"; }
TORCH_BLAS_PREFER_CUBLASLT=1 timeout 100 $LOOM bench latency $D --output-json $R/tp2-decode-lt.json > $R/tp2-decode-lt.log 2>&1
echo "cuBLASLt: $(grep -E '^Decode' $R/tp2-decode-lt.log)"
stamp decode
P="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 -tp 2 --output-len 1 --batch-size 1 --num-iters-warmup 5 --num-iters 15"
for run in "8192 FULL_AND_PIECEWISE [8192]" "128 FULL_AND_PIECEWISE []" "128 FULL_DECODE_ONLY []" "128 FULL_AND_PIECEWISE [] 1"; do
  set -- $run; LEFT=$(( 570 - ($(date +%s) - T0) )); [ $LEFT -lt 45 ] && { echo "$run: skipped for time"; continue; }
  NAME=tp${4:-2}-$1-$2-$3; NAME=${NAME//[\[\]]/}
  timeout $LEFT $LOOM bench latency ${P/-tp 2/-tp ${4:-2}} --input-len $1 -O "{\"level\":3,\"compile_sizes\":$3,\"cudagraph_capture_sizes\":[],\"cudagraph_mode\":\"$2\"}" --output-json $R/$NAME.json > $R/$NAME.log 2>&1
  echo "$NAME: $(grep -E '^Avg' $R/$NAME.log) $(grep -h 'pieces captured' $R/$NAME.log | sed 's/.*piecewise/piecewise/' | head -2 | tr '\n' ' ')"
done
rm -f $R/prof/trace-rank*.json
tar czf $OUT/w.tgz -C $R . ; stamp done
