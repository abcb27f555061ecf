# x2 (~3.5 min), after run_u: p2p's GPU test once more (inside the decode graph of 24 its
# ops now take NCCL collectives and plain matmuls: PyTorch's fused op failed there, its
# workspace cannot grow during a capture), then 1-GPU prefill 8192 with and without
# piecewise graphs (issue 3's 85% of the matmul ceiling; 79.1% at f1214a8).
source benchmarks/gpu/env.sh
R=/tmp/v; mkdir -p $R
timeout -s INT 90 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short -m gpu "tests/compilation/test_tp2_passes.py::test_collective_matmuls_on_gpu[p2p]" > $R/tests.log 2>&1; echo "rc=$?" >> $R/tests.log
grep -E "^(FAILED|ERROR|E  )|passed|failed|rc=" $R/tests.log | tail -12
stamp tests
export CUDA_VISIBLE_DEVICES=0
B="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --output-len 1 --batch-size 1 --num-iters-warmup 5 --num-iters 15 --input-len 8192"
for mode in FULL_AND_PIECEWISE FULL_DECODE_ONLY; do
  LEFT=$(( 215 - ($(date +%s) - T0) )); [ $LEFT -lt 40 ] && { echo "$mode: skipped for time"; continue; }
  timeout $LEFT $LOOM bench latency $B -O "{\"level\":3,\"compile_sizes\":[8192],\"cudagraph_capture_sizes\":[],\"cudagraph_mode\":\"$mode\"}" --output-json $R/tp1-s8192-$mode.json > $R/tp1-s8192-$mode.log 2>&1
  echo "$mode: $(grep -E '^Avg' $R/tp1-s8192-$mode.log) $(grep -E '^Prefill' $R/tp1-s8192-$mode.log | cut -c1-100)"
done
tar czf $OUT/v.tgz -C $R . ; stamp done
