# 1 GPU (~5 min), session 27: the split-K decode kernel stacking key chunks in its GQA
# padding rows (paged_decode's stack) against the best unstacked tiles, per shape.
# Ran at 7832785..1df2aae; paged_decode's stack (and --tune-stack) were taken out after it.
source benchmarks/gpu/env.sh; R=$OUT/zzz46; mkdir -p $R
W="--tune-warps 2 4 8 --tune-stages 2 3"
timeout 120 python3 -m pytest -q -m gpu tests/kernels/test_paged_decode_stack.py > $R/tests.log 2>&1
echo "tests rc $?"; tail -3 $R/tests.log; stamp tests
one() {  # name, stack, block_ns, then bench args
  local name=$1 st=$2 bn=$3; shift 3
  timeout 150 $LOOM bench attention --mode decode --tune --tune-stack $st --tune-block-n $bn $W "$@" --output-json $R/$name-s$st.json > $R/$name-s$st.log 2>&1
  echo "$name stack $st rc $?"; quiet < $R/$name-s$st.log | grep -E "B=|tuned" | cut -c1-200; stamp $name-s$st
}
for kv in fp8 auto; do  # throughput's decode steps (8B, one split per request)
  one tp-$kv 1 "16 32 64 128" --kv-cache-dtype $kv --batch-sizes 484 872 --context-lens 1150 --tune-splits 1
  one tp-$kv 4 16 --kv-cache-dtype $kv --batch-sizes 484 872 --context-lens 1150 --tune-splits 1
done
for st in 1 4; do  # batch 1-4, split-K (8B)
  bn="16 32 64 128"; [ $st = 4 ] && bn=16
  one lat $st "$bn" --batch-sizes 1 4 --context-lens 256 1024 4096 8192 --tune-splits 1 2 4 8 16 32
done
for st in 1 2; do  # Qwen3-30B-A3B: groups of 8
  bn="16 32 64 128"; [ $st = 2 ] && bn=16
  one qwen-b1 $st "$bn" --model qwen3-30b-a3b --batch-sizes 1 --context-lens 1024 4096 --tune-splits 1 2 4 8 16 32
  one qwen-tp $st "$bn" --model qwen3-30b-a3b --batch-sizes 484 --context-lens 1150 --tune-splits 1
done
tar czf $OUT/zzz46.tgz -C $R .
