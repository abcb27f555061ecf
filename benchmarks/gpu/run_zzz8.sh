# 1 GPU (~9 min). Served TTFT at 10 QPS (8B dummy, 550 -> 150; issue 7's goal: <= 40 ms)
# after the piecewise graphs past 512 tokens (run_zzz7: in-process prompt steps 17.0 / 20.2
# ms median against 21.9 / 31.9 with the sizes stopping at 512). Servers in turn on this
# GPU, the same sweep and flags as run_zzz: this tree, 07a738d's (old07/, untracked,
# travels), this tree again.
source benchmarks/gpu/env.sh
R=$OUT/zzz8; mkdir -p $R
O='{"level":3,"cudagraph_capture_sizes":[1,2,4,8,16,24,32,40,48,56,64]}'
sweep() {  # name dir deadline
  local name=$1 dir=$2 deadline=$3
  (cd $dir && timeout $(left $deadline) $LOOM bench sweep --model llama-3.1-8b --rates 10 \
    --modes multiprocess --duration 30 --ignore-eos --dataset-name random --random-input-len 550 \
    --random-output-len 150 --result-dir $R/$name \
    -- --load-format dummy --max-model-len 2048 -O "$O" > $R/$name.log 2>&1)
  grep -E "server side|^ +10 \|" $R/$name.log; stamp "$name"
}
sweep head . 175
sweep old07 old07 345
sweep head-again . 515
find $R -name "server-multiprocess.log" -size +2M -delete
tar czf $OUT/zzz8.tgz -C $R . ; stamp done
