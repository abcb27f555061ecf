# 1 GPU, session 29, the last ~190 s: run_zzz58 put the GEMV table up to 16 rows 1.27x /
# 1.31x slower than the former at batch 16 / 4. Suspect: the down projection, whose
# GEMV recomputes SiLU·mul for 16 padded rows in 64 programs (gemv_bench timed it without
# the SiLU). The same table with down at 2..16 rows null (cuBLAS) against the former.
source benchmarks/gpu/env.sh; R=$OUT/zzz59; mkdir -p $R
L="--model llama-3.1-8b --load-format dummy --input-len 128 --output-len 128 --num-iters-warmup 2 --num-iters 4 -O 3"
for b in 16 4; do
  for t in new old; do
    [ $(left 185) -lt 30 ] && { echo "no time for $t b$b"; continue; }
    if [ $t = old ]; then export LOOM_MOE_CONFIG_DIR=$PWD/oldcfg29; else unset LOOM_MOE_CONFIG_DIR; fi
    timeout $(left 185) $LOOM bench latency $L --batch-size $b --output-json $R/lat-$t-b$b.json > $R/lat-$t-b$b.log 2>&1
    echo "$t b$b rc $? $(grep -E '^Decode' $R/lat-$t-b$b.log | cut -c1-40)"; stamp $t b$b
  done
done
unset LOOM_MOE_CONFIG_DIR
tar czf $OUT/zzz59.tgz -C $R .
