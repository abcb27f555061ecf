# x2 (~7 min), after run_zzj. Llama-3.1-8B TP=2 prefill of 2048 and 8192 tokens against
# issue 4's goal, 1.15x of (1-GPU prefill / 2) + the measured all-reduce time: each length on
# one GPU first (the reference JSON), then at TP=2, which prints the ratio to that target
# (0.99x / 1.07x at 94c6b95). Then Qwen3-30B-A3B's TP=2 decode with the N=384 MoE table
# and its GEMV shards (moved here from run_zzj in session 23).
source benchmarks/gpu/env.sh
R=/tmp/zzk; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
for n in 2048 8192; do
  P="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --input-len $n --output-len 1 --batch-size 1 --num-iters-warmup 3 --num-iters 10 -O 3"
  CUDA_VISIBLE_DEVICES=0 timeout 110 $LOOM bench latency $P --output-json $R/tp1-prefill$n.json > $R/tp1-prefill$n.log 2>&1
  grep -E "^Prefill" $R/tp1-prefill$n.log | cut -c1-200
  timeout $(left 560) $LOOM bench latency $P -tp 2 --reference-json $R/tp1-prefill$n.json --output-json $R/tp2-prefill$n.json > $R/tp2-prefill$n.log 2>&1
  grep -E "^(Prefill|All-reduce)" $R/tp2-prefill$n.log | head -3 | cut -c1-220
done; stamp "8b prefill"
Q="--model qwen3-30b-a3b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 -tp 2 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout $(left 590) $LOOM bench latency $Q --output-json $R/qwen3-tp2-decode.json > $R/qwen3-tp2-decode.log 2>&1
echo "qwen3 tp2: $(grep -E '^Decode' $R/qwen3-tp2-decode.log | head -1)"; grep -h "fused_moe: no tuned" $R/qwen3-tp2-decode.log | head -2; stamp "qwen3 tp2 decode"
tar czf $OUT/zzk.tgz -C $R . ; stamp done
