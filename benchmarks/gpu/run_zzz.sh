# 1 GPU (~8 min), session 17. Where does served TTFT go at 10 QPS (8B, 550 -> 150)? run_zzw
# gave 40.5 ms at 07a738d against 88.4 ms at 0bfffdb in one call; the engine in-process
# (run_zzx) reached the first token in 32.5 ms. Four servers in turn on this GPU, the same
# sweep and flags (decode graphs only up to 64: at 10 QPS ~15-25 run, and capture is 24-42 s):
#   head     this tree; the sweep prints the server's own split of TTFT (queue, prefill, the rest)
#   old07    07a738d's tree (old07/, untracked, travels)
#   toggles  this tree with the suspects since 07a738d off at once: Python's GC thresholds,
#            FULL_DECODE_ONLY graphs, no decode GEMV, no admission headroom
#   mid      a96a380's tree (mid/): the bisection's midpoint among the commits touching loom/
source benchmarks/gpu/env.sh
R=$OUT/zzz; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
O='{"level":3,"cudagraph_capture_sizes":[1,2,4,8,16,24,32,40,48,56,64]}'
O_OFF='{"level":3,"cudagraph_capture_sizes":[1,2,4,8,16,24,32,40,48,56,64],"cudagraph_mode":"FULL_DECODE_ONLY"}'
sweep() {  # name dir deadline -O [extra server flags...]
  local name=$1 dir=$2 deadline=$3 opt=$4; shift 4
  (cd $dir && timeout $(left $deadline) $LOOM bench sweep --model llama-3.1-8b --rates 10 \
    --modes multiprocess --duration 30 --ignore-eos --dataset-name random --random-input-len 550 \
    --random-output-len 150 --result-dir $R/$name \
    -- --load-format dummy --max-model-len 2048 -O "$opt" "$@" > $R/$name.log 2>&1)
  grep -E "server side|^ +10 \|" $R/$name.log; stamp "$name"
  grep -E "loom\.(worker|engine\.core|compilation\.backend)|jit_watch|Triton compile" $R/$name/server-multiprocess.log | tail -12 > $R/$name-server-head.txt
}
nproc
sweep head . 200 "$O"
sweep old07 old07 370 "$O"
LOOM_GC_THRESHOLDS=700,10,10 LOOM_DECODE_GEMV=0 sweep toggles . 490 "$O_OFF" --kv-headroom-tokens 0
sweep mid mid 595 "$O"
find $R -name "server-multiprocess.log" -size +2M -delete; stamp done
