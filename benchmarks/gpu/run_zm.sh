# 1 GPU (~3 min), session 11. run_zl: LOOM_TRITON_ADD_NORM=1 (add + RMSNorm in loom's
# kernel, not Inductor's) made 1-GPU decode 4.345 -> 4.251 ms/token. Before it becomes the
# default: the two kernels side by side from 1 to 16384 rows (prompt steps have 16384), the
# 8192-token prefill with and without, and decode again.
source benchmarks/gpu/env.sh
R=/tmp/zm; mkdir -p $R
timeout 90 python3 benchmarks/gpu/add_norm_probe.py > $R/add-norm-probe.log 2>&1; grep -E "^M=|Error" $R/add-norm-probe.log; stamp probe
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
P="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --input-len 8192 --output-len 1 --batch-size 1 --num-iters-warmup 3 --num-iters 10 -O 3"
run() { name=$1; args=$2; shift 2; env "$@" timeout 80 $LOOM bench latency $args --output-json $R/$name.json > $R/$name.log 2>&1; echo "$name: $(grep -E '^(Decode|Prefill)' $R/$name.log | tail -1)"; }
run tp1-addnorm "$D" LOOM_TRITON_ADD_NORM=1
run tp1-default "$D" LOOM_TRITON_ADD_NORM=0
run prefill8192-addnorm "$P" LOOM_TRITON_ADD_NORM=1
run prefill8192-default "$P" LOOM_TRITON_ADD_NORM=0
tar czf $OUT/zm.tgz -C $R . ; stamp done
