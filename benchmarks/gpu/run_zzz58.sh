# 1 GPU, session 29: run_zzz57's A/B again at -O 3 (bench latency's default is level 0,
# where the decode GEMV pass does not run, so run_zzz57's A/B compared cuBLAS with
# cuBLAS). 8B decode, 128 -> 128, batch 16 and 4: the GEMV table up to 16 rows (in the
# tree) against the former one (oldcfg29/, via LOOM_MOE_CONFIG_DIR), alternated.
source benchmarks/gpu/env.sh; R=$OUT/zzz58; mkdir -p $R
L="--model llama-3.1-8b --load-format dummy --input-len 128 --output-len 128 --num-iters-warmup 2 --num-iters 5 -O 3"
for rep in 1 2; do
  for b in 16 4; do
    for t in new old; do
      [ $(left 430) -lt 45 ] && { echo "no time for $t b$b rep$rep"; continue; }
      if [ $t = old ]; then export LOOM_MOE_CONFIG_DIR=$PWD/oldcfg29; else unset LOOM_MOE_CONFIG_DIR; fi
      timeout $(left 430) $LOOM bench latency $L --batch-size $b --output-json $R/lat-$t-b$b-$rep.json > $R/lat-$t-b$b-$rep.log 2>&1
      echo "$t b$b rep$rep rc $? $(grep -E '^Decode' $R/lat-$t-b$b-$rep.log | cut -c1-120)"; grep -E "decode_gemv:|compiled while serving" $R/lat-$t-b$b-$rep.log | head -2 | cut -c1-200; stamp $t b$b
    done
  done
done
unset LOOM_MOE_CONFIG_DIR
tar czf $OUT/zzz58.tgz -C $R .
