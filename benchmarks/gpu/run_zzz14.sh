# 1 GPU (~2 min), session 19. Where does a mixed step's split beat one launch, by decode
# count and context length? run_zzz11 could not say below 16 decodes (the backend took one
# launch there; 7f552f3 makes `bench attention --mode mixed` time the split at any count):
# at 16 decodes the split was 0.86x as fast at 700-token contexts and 1.55x at 2000.
source benchmarks/gpu/env.sh
R=$OUT/zzz14; mkdir -p $R
timeout 200 $LOOM bench attention --model llama-3.1-8b --mode mixed --batch-sizes 1 2 4 8 12 16 24 \
  --context-lens 700 2000 4000 8000 --prompt-tokens 550 --chunk-len 550 --output-json $R/mixed-sweep.json > $R/mixed-sweep.log 2>&1
grep -E "^ceilings|^B=|single launch" $R/mixed-sweep.log | cut -c1-150; stamp "mixed sweep"
tar czf $OUT/zzz14.tgz -C $R . ; stamp done
