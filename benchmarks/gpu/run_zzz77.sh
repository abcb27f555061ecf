# 1 GPU (~5 min), session 33: FULL's packed attention launch with its tile starts computed
# once a step on the device (programs past the batch's tiles exit after one load; run_zzz76
# had the 128-token step's attention at 16.3 us a layer, 1056 programs each searching).
# GPU tests (fixed-shape attention in bf16, the tiny models under FULL against the CPU), the
# 128-token prompt step default against FULL alternated, the 4 x 128 step under FULL, and a
# torch.profiler table of FULL's 128-token step.
source benchmarks/gpu/env.sh; R=$OUT/zzz77; mkdir -p $R
timeout 120 python3 -m pytest -q -m gpu tests/kernels/test_paged_attention.py tests/e2e/test_gpu.py \
  -k "gpu_bf16 or (equals_cpu and full and not level0)" > $R/tests.log 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed|FAIL|Error" $R/tests.log | tail -8; stamp tests
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 3 --num-iters 10 --output-len 1"
run() {  # mode (default|full), name, flags...
  local mode=$1 name=$2; shift 2
  [ $(left 320) -lt 35 ] && { echo "no time for $mode $name"; return; }
  local o=(); [ $mode = full ] && o=(-O '{"cudagraph_mode": "FULL"}')
  timeout $(left 330) $LOOM bench latency $L "$@" "${o[@]}" --output-json $R/$name-$mode.json 2>&1 | quiet > $R/$name-$mode.log
  echo "$mode $name $(grep -E '^Avg' $R/$name-$mode.log)"
}
run full p128-1 --input-len 128 --batch-size 1 --profile --profile-result-dir $R/prof
find $R/prof -name "trace*" -delete
i=1; for m in default full default full; do i=$((i+1)); run $m p128-$i --input-len 128 --batch-size 1; done
run full b4-1 --input-len 128 --batch-size 4
stamp bench
tar czf $OUT/zzz77.tgz -C $R .
