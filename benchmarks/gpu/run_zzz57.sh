# 1 GPU, session 29: the decode GEMV up to 16 rows (MAX_M 8 -> 16). gemv_bench measures
# Llama-3.1-8B's 1-GPU shapes at 2, 4, 8 and 16 rows and merges its winners (null where
# cuBLAS won) into the H200 table; then 8B decode at batch 16 and 8, 128 -> 128, with that
# table against the former one (LOOM_MOE_CONFIG_DIR), alternated.
source benchmarks/gpu/env.sh; R=$OUT/zzz57; mkdir -p $R
cp -r loom/kernels/configs $R/old-configs
TABLE=loom/kernels/configs/gemv,dtype=bfloat16,device_name=NVIDIA_H200.json
timeout $(left 60) python3 -m pytest -q -x tests/kernels/test_gemv_kernel.py -m gpu 2>&1 | tail -2; stamp gemv tests
timeout $(left 300) python3 benchmarks/gpu/gemv_bench.py --shapes qkv1,o1,gate_up1,down1,lm_head1 --ms 2,4,8,16 --budget-s 190 --output-json $R/gemv.json --write-table $TABLE > $R/gemv.log 2>&1
echo "gemv_bench rc $?"; quiet < $R/gemv.log | tail -32 | cut -c1-170; cp $TABLE $R/; stamp gemv_bench
L="--model llama-3.1-8b --load-format dummy --input-len 128 --output-len 128 --num-iters-warmup 2 --num-iters 5"
for rep in 1 2; do
  for b in 16 8; do
    for t in new old; do
      [ $(left 560) -lt 50 ] && { echo "no time for $t b$b rep$rep"; continue; }
      if [ $t = old ]; then export LOOM_MOE_CONFIG_DIR=$R/old-configs; else unset LOOM_MOE_CONFIG_DIR; fi
      timeout $(left 560) $LOOM bench latency $L --batch-size $b --output-json $R/lat-$t-b$b-$rep.json > $R/lat-$t-b$b-$rep.log 2>&1
      echo "$t b$b rep$rep rc $? $(grep -E 'Avg latency' $R/lat-$t-b$b-$rep.log)"; grep -E "decode_gemv|compiled while serving" $R/lat-$t-b$b-$rep.log | head -2 | cut -c1-200; stamp $t b$b
    done
  done
done
unset LOOM_MOE_CONFIG_DIR
tar czf $OUT/zzz57.tgz -C $R .
