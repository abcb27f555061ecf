# 1 GPU (~8 min cold), session 23, after run_zzz26 turned the norm-in-GEMV fusion on (the
# rank's shapes 2.48 against 2.55 ms/token). It fuses only where the plain table's config
# reduces rows unsplit: qkv at one row. The rank's gate_up at one row ran as fast without
# tensor cores (29.4 against 29.3 us, gemv_bench), so its norm could go in too.
# 1. the GEMV's GPU tests; 2. norm_gemv_probe measures the fused call with every
# row-reduction tile at 1 and 2 rows and writes the "gemv_norm" table; 3. decode batch 1,
# 128 -> 128, level 3, with that table (tab) against without (the plain rule, plain),
# alternated: the rank's shapes twice each, 8B once each.
source benchmarks/gpu/env.sh; R=$OUT/zzz27; mkdir -p $R
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv_kernel.py > $R/tests-gemv.log 2>&1
echo "gemv tests rc $?: $(tail -1 $R/tests-gemv.log)"; grep -E "^(FAILED|ERROR)" $R/tests-gemv.log | head -5
stamp tests
mkdir -p /tmp/cfg; cp loom/kernels/configs/*.json /tmp/cfg/
TABLE="gemv_norm,dtype=bfloat16,device_name=NVIDIA_H200.json"
timeout 200 python3 benchmarks/gpu/norm_gemv_probe.py $R/norm-gemv.json --ms 1,2 \
  --write-table /tmp/cfg/$TABLE > $R/norm-gemv.log 2>&1
echo "probe rc $?"; grep -E "M=|wrong|wrote|Error" $R/norm-gemv.log | head -20; cp /tmp/cfg/$TABLE $R/ 2>/dev/null
stamp probe
python3 benchmarks/gpu/rank_config.py /tmp/llama-8b-tp2-rank.json
D="--load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
n=0
for spec in rank:tab rank:plain rank:tab rank:plain 8b:tab 8b:plain; do
  m=${spec%:*}; t=${spec#*:}; n=$((n+1))
  model=llama-3.1-8b; [ $m = rank ] && model=/tmp/llama-8b-tp2-rank.json
  [ $(left 560) -lt 60 ] && { echo "no time for $m-$t ($n)"; break; }
  dir=; [ $t = tab ] && dir=/tmp/cfg
  LOOM_MOE_CONFIG_DIR=$dir timeout $(left 590) $LOOM bench latency --model $model $D \
    --output-json $R/$m-$t-$n.json > $R/$m-$t-$n.log 2>&1
  echo "$m-$t-$n rc $?: $(grep -E '^Decode' $R/$m-$t-$n.log | head -1 | cut -c1-150)"
  grep -E "decode_gemv" $R/$m-$t-$n.log | tail -1 | cut -c60-260; stamp $m-$t-$n
done
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz27.tgz -C $R .
