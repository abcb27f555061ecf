# 1 GPU (warm H100, ~90 s; 198 s of device time left), session 23: Qwen3-30B-A3B decode batch 1,
# 128 -> 128, with run_zzz30's H100 GEMV table at Qwen3's shapes (tab: the tree, the table copied
# into loom/kernels/configs) against the tables before it (plain: carried as ./oldcfg, untracked).
source benchmarks/gpu/env.sh; R=$OUT/zzz31; mkdir -p $R
D="--load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 1 --num-iters 3 -O 3"
for t in tab plain; do
  dir=; [ $t = plain ] && dir=$PWD/oldcfg
  LOOM_MOE_CONFIG_DIR=$dir timeout $(left 150) $LOOM bench latency --model qwen3-30b-a3b $D --output-json $R/q3-$t.json > $R/q3-$t.log 2>&1
  echo "q3-$t rc $?: $(grep -E '^Decode' $R/q3-$t.log | head -1 | cut -c1-150)"; stamp q3-$t
done
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
