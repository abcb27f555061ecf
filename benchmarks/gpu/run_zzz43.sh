# 1 GPU (~2 min cold), session 26: decode attention at batch 1, short contexts — do fewer
# splits (now that the splits merge themselves) beat the default's 2-4?
source benchmarks/gpu/env.sh; R=$OUT/zzz43; mkdir -p $R
for m in llama-3.1-8b; do
timeout 250 $LOOM bench attention --model $m --mode decode --batch-sizes 1 2 --context-lens 128 256 512 --tune --tune-splits 1 2 4 8 --tune-block-n 16 32 64 128 --tune-stages 2 3 --output-json $R/attn-$m.json > $R/attn-$m.log 2>&1
echo "attn $m rc $?"; quiet < $R/attn-$m.log | cut -c1-220 | tail -40; stamp attn-$m
done
tar czf $OUT/zzz43.tgz -C $R .
