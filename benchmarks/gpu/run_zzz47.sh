# 1 GPU (~8 min cold), session 27.
# 1. GPU tests of the decode kernel (stacked tiles, 8-bit cache);
# 2. long contexts at batch 1 and 4: stacked tiles (stack 4) against unstacked ones, the
#    same reduced sweep (run_zzz46's unstacked sweep ran out of time there);
# 3. 8B throughput over an fp8 cache: HEAD's tiles (64 keys, 2 warps, 3 stages at wide
#    batches) against the former ones (LOOM_DECODE_TILES=128,4,3), one run each.
# Ran at 7832785..1df2aae; paged_decode's stack (and --tune-stack) were taken out after it.
source benchmarks/gpu/env.sh; R=$OUT/zzz47; mkdir -p $R
timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_paged_decode_stack.py tests/kernels/test_kv_cache_fp8.py tests/kernels/test_paged_attention.py > $R/tests.log 2>&1
echo "tests rc $?"; tail -3 $R/tests.log; stamp tests
for st in 1 4; do
  bn="32 64 128"; [ $st = 4 ] && bn=16
  timeout 100 $LOOM bench attention --mode decode --tune --tune-stack $st --tune-block-n $bn --tune-warps 4 --tune-stages 2 3 --tune-splits 8 16 32 --batch-sizes 1 4 --context-lens 4096 8192 --output-json $R/long-s$st.json > $R/long-s$st.log 2>&1
  echo "long stack $st rc $?"; quiet < $R/long-s$st.log | grep -E "B=|tuned" | cut -c1-200; stamp long-s$st
done
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown --kv-cache-dtype fp8"
for tiles in head 128,4,3; do
  [ $(left 570) -lt 110 ] && { echo "no time for thr-$tiles"; break; }
  if [ $tiles = head ]; then unset LOOM_DECODE_TILES; else export LOOM_DECODE_TILES=$tiles; fi
  timeout $(left 590) $LOOM bench throughput $T --output-json $R/thr-fp8-$tiles.json > $R/thr-fp8-$tiles.log 2>&1
  echo "thr-fp8 $tiles rc $?"; grep -E "^(Throughput|Compute floor|  decode only|  with prompt|  steps)" $R/thr-fp8-$tiles.log | cut -c1-220; stamp thr-$tiles
done
unset LOOM_DECODE_TILES
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz47.tgz -C $R .
