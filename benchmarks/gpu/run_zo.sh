# x2 (~2.5 min), session 11, only if a 2-GPU host is lent again with ~170 s of device time
# left. Programmatic dependent launch (LOOM_PDL=1) at TP=2 decode, where each all-reduce
# waits on the peer (65 x 6.8 us a token) and the next GEMV could start meanwhile; 1-GPU
# decode was slower with it (4.338 -> 4.396-4.439 ms/token, run_zk/zl). Default first
# (2.915 ms/token in run_zg).
source benchmarks/gpu/env.sh
R=/tmp/zo; mkdir -p $R
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 -tp 2 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
run() { name=$1; shift; env "$@" timeout 75 $LOOM bench latency $D --output-json $R/$name.json > $R/$name.log 2>&1; echo "$name: $(grep -E '^Decode' $R/$name.log | head -1)"; }
run tp2-default LOOM_PDL=0
run tp2-pdl LOOM_PDL=1
tar czf $OUT/zo.tgz -C $R . ; stamp done
