# 1 GPU (~5 min), session 10's last call: run_ze ran the GEMV by default without run_zd's
# 1-GPU table in the tree (now committed), and its 8B throughput came out 44.11 s against
# run_zd's 41.11: the GEMV's share, or another GPU of the pool? Same call, both ways.
# 1. 1-GPU decode at the defaults (the GEMV with the 1-GPU table: 4.298 ms in run_zd).
# 2. 8B throughput at the defaults, then with LOOM_DECODE_GEMV=0.
source benchmarks/gpu/env.sh
R=/tmp/zf; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 80 $LOOM bench latency $D --output-json $R/tp1-decode.json > $R/tp1-decode.log 2>&1
echo "tp1 decode: $(grep -E '^Decode' $R/tp1-decode.log | head -1)"; grep -ho 'decode_gemv: [0-9]* matmuls.*' $R/tp1-decode.log | head -3; stamp "tp1 decode"
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
timeout 130 $LOOM bench throughput $T --output-json $R/throughput-8b.json > $R/thr8b.log 2>&1
LOOM_DECODE_GEMV=0 timeout $(left 330) $LOOM bench throughput $T --output-json $R/throughput-8b-nogemv.json > $R/thr8b-nogemv.log 2>&1
for f in thr8b thr8b-nogemv; do echo "== $f"; grep -E "^(Throughput|Compute floor)|^  (decode only|with prompt|steps')" $R/$f.log | cut -c1-200; done
tar czf $OUT/zf.tgz -C $R . ; stamp done
