# 1 GPU (~5 min warm), session 30: 8B throughput, 1000 x 1024 -> 256, with no -O (the level
# now defaults to 3 on CUDA) on the table run_zzz60 chose; then batch 2, which run_zzz60 did
# not run, 128 -> 128 at -O 3, on that table against the former one, alternated. Before
# the call, copy f0a5b35's tables (untracked; the script reads them through
# LOOM_MOE_CONFIG_DIR): mkdir zz_oldcfg && git archive f0a5b35 loom/kernels/configs |
# tar x --strip-components=3 -C zz_oldcfg
source benchmarks/gpu/env.sh; R=$OUT/zzz62; mkdir -p $R
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 --step-breakdown"
timeout $(left 330) $LOOM bench throughput $T --output-json $R/thr-8b-default.json > $R/thr-8b-default.log 2>&1
echo "thr rc $?"; grep -E "torch.compile level|^(Throughput|Compute floor|  decode only|  with prompt|  steps)" $R/thr-8b-default.log | cut -c1-220; stamp thr
L="--model llama-3.1-8b --load-format dummy --input-len 128 --output-len 128 --num-iters-warmup 2 --num-iters 4 -O 3 --batch-size 2"
for rep in 1 2; do
  for t in new old; do
    [ $(left 560) -lt 40 ] && { echo "no time for $t rep$rep"; continue; }
    if [ $t = old ]; then export LOOM_MOE_CONFIG_DIR=$PWD/zz_oldcfg; else unset LOOM_MOE_CONFIG_DIR; fi
    timeout $(left 560) $LOOM bench latency $L --output-json $R/lat-$t-b2-$rep.json > $R/lat-$t-b2-$rep.log 2>&1
    echo "$t b2 rep$rep rc $? $(grep -E '^Decode' $R/lat-$t-b2-$rep.log | cut -c1-40)"; stamp $t b2
  done
done
unset LOOM_MOE_CONFIG_DIR
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz62.tgz -C $R .
