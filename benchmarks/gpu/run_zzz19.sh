# 1 GPU (~1.5 min on a warm host whose caches run_zzz18 filled), session 20. run_zzz18's
# new-warm run ran out of its slot (killed during the decode-graph capture), so this is its
# A/B: start-up and batch-1 decode with keep_guards (new) and with every guard kept (old,
# run_zzz18's /tmp/oldtree), both with warm Triton and Inductor caches.
source benchmarks/gpu/env.sh; R=$OUT/zzz19; mkdir -p $R
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5"
O='{"level":3,"cudagraph_capture_sizes":[1,2,4,8,16,24,32,40,48,56,64]}'
for n in new-warm old-warm2; do
  t=$(date +%s); tree=$PWD; [ $n = old-warm2 ] && tree=/tmp/oldtree
  (cd $tree && TORCH_LOGS=recompiles PYTHONPATH=/tmp/site:$tree timeout 100 python3 -m loom.cli \
    bench latency $D -O "$O" --output-json $R/$n.json > $R/$n.log 2>&1)
  echo "$n: wall $(( $(date +%s) - t )) s; $(grep -E '^Decode' $R/$n.log | cut -c1-40)"
  grep -E "captured [0-9]+ CUDA|torch.compile level|level 3: split|shape guards|warm-up:" $R/$n.log | cut -c1-150
  grep -c "Recompiling" $R/$n.log
done
tar czf $OUT/zzz19.tgz -C $R .
