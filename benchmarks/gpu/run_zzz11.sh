# 1 GPU (~7 min), session 19. Issue 3's standing figures after session 18's piecewise sizes
# (prefill 2048 now replays graphs; throughput's decode steps of 513-1024 requests are
# padded onto piece graphs) and the mixed-split default raised to 16 decodes:
# 1. the split against one launch, GPU time, at 10 QPS's mixed shapes (a 550-token prompt
#    beside 2..64 decodes of 700 / 2000 tokens): where does one launch start to lose?
# 2. 8B prefill 2048 and 8192, decode batch 1, throughput (1000 x 1024 -> 256).
source benchmarks/gpu/env.sh
R=$OUT/zzz11; mkdir -p $R
timeout 100 $LOOM bench attention --model llama-3.1-8b --mode mixed --batch-sizes 2 4 8 12 16 24 32 48 64 \
  --context-lens 700 2000 --prompt-tokens 550 --chunk-len 550 --output-json $R/mixed-sweep.json > $R/mixed-sweep.log 2>&1
grep -E "^ceilings|^B=|single launch" $R/mixed-sweep.log | cut -c1-200; stamp "mixed sweep"
P="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --output-len 1 --batch-size 1 --num-iters-warmup 3 --num-iters 10 -O 3"
for n in 2048 8192; do
  timeout 100 $LOOM bench latency $P --input-len $n --output-json $R/prefill$n.json > $R/prefill$n.log 2>&1
  grep -E "^(Avg latency|Prefill)|captured|pieces captured" $R/prefill$n.log | cut -c1-220; stamp "prefill $n"
done
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 90 $LOOM bench latency $D --output-json $R/decode.json > $R/decode.log 2>&1
grep -E "^(Avg latency|Decode)|captured|warm-up" $R/decode.log | cut -c1-260; stamp "decode b1"
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
timeout $(left 560) $LOOM bench throughput $T --output-json $R/thr-8b.json > $R/thr-8b.log 2>&1
grep -E "^(Throughput|  |Compute floor)" $R/thr-8b.log | grep -v "full collection walked" | cut -c1-240; stamp "8b throughput"
tar czf $OUT/zzz11.tgz -C $R . ; stamp done
