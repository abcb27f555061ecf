# 1 GPU (~2.5 min), session 19. Batch-1 decode from a size-2 CUDA graph (the general,
# dynamic-shape graph) against the size-1 graph, which Dynamo compiles on its own (the
# token dimension of one is specialised): that compile is 4.7-7.5 s of the 8B start-up
# (run_zzz12). If the size-2 graph decodes one request as fast, the default capture sizes
# can skip 1. A/B (the device time left allowed two runs), decode 128 -> 128 at batch 1.
source benchmarks/gpu/env.sh
R=$OUT/zzz15; mkdir -p $R
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5"
one() {  # name deadline sizes
  timeout $(left $2) $LOOM bench latency $D -O "{\"level\":3,\"cudagraph_capture_sizes\":[$3]}" \
    --output-json $R/$1.json > $R/$1.log 2>&1
  echo "$1: $(grep -E '^Decode' $R/$1.log | cut -c1-120)"
  grep -E "captured [0-9]+ CUDA graphs|torch.compile level" $R/$1.log | cut -c1-160; stamp "$1"
}
one size1-a 80 1
one size2-a 150 2
tar czf $OUT/zzz15.tgz -C $R . ; stamp done
