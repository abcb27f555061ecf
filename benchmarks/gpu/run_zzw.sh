# 1 GPU (~5 min), session 16. run_zzv served 8B at 10 QPS (550 -> 150 tokens) with a mean
# TTFT of 51.8 ms and ITL p99 38.6 ms; at 07a738d (session 10, an x2 host) the same sweep
# gave 37.0 ms and 20.5 ms. The code, or the host? The same sweep on 07a738d's tree (old07/)
# and on this one, in turn, on this GPU.
source benchmarks/gpu/env.sh
R=/tmp/zzw; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
nproc; lscpu | grep -E "Model name|^CPU\(s\)"
for tree in old07 new; do
  dir=$PWD; [ $tree = old07 ] && dir=$PWD/old07
  (cd $dir && timeout $(left $([ $tree = old07 ] && echo 270 || echo 560)) $LOOM bench sweep --model llama-3.1-8b --rates 10 \
    --modes multiprocess --duration 30 --ignore-eos --dataset-name random --random-input-len 550 \
    --random-output-len 150 --result-dir $R/serve-$tree \
    -- --load-format dummy --max-model-len 2048 -O '{"level":3}' > $R/serve-$tree.log 2>&1)
  grep -v -E "^(INFO|DEBUG)|it/s\]|s/it\]" $R/serve-$tree.log | tail -3; stamp "serve, $tree"
done
tar czf $OUT/zzw.tgz -C $R . ; stamp done
