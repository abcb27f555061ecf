# 1 GPU (~10 min cold), session 22: two fusions that shorten the batch-1 decode chain.
# (a) the residual add + RMSNorm read by the qkv / gate_up GEMV (TP=1; was Inductor's own
#     kernel, 2.1-2.4 us + ~1 us idle, 64 a token); (b) decode attention's split merge done
#     by the last split program (was a second kernel, 2.1 us + idle, 32 a token).
# 1. the GEMV's GPU tests (the decode attention's ran in the helper's calls: 36 passed);
# 2. norm_gemv_probe: fused against norm + GEMV per shape and row count (where it pays);
# 3. decode batch 1, 128 -> 128 at level 3: the TP=2-rank-shaped model (run_zzz20's) and
#    Llama-3.1-8B, this tree (new) against 2b28d78 (old, carried as ./oldtree); the rank
#    also at f3bb3ee (mid: the attention merge without the norm fusion, ./midtree);
# 4. the e2e GPU tests (greedy tokens against the CPU reference and transformers), if time
#    is left.
source benchmarks/gpu/env.sh; R=$OUT/zzz24; mkdir -p $R
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv_kernel.py > $R/tests-gemv.log 2>&1
echo "gemv tests rc $?: $(tail -1 $R/tests-gemv.log)"; grep -E "^(FAILED|ERROR)" $R/tests-gemv.log | head -5
stamp tests
timeout $(left 210) python3 benchmarks/gpu/norm_gemv_probe.py $R/norm-gemv.json > $R/norm-gemv.log 2>&1
echo "probe rc $?"; grep -E "M=" $R/norm-gemv.log; stamp probe
python3 benchmarks/gpu/rank_config.py /tmp/llama-8b-tp2-rank.json
D="--load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
n=0
for spec in rank:new rank:mid rank:old 8b:new 8b:old; do
  m=${spec%:*}; tree=${spec#*:}; n=$((n+1))
  model=llama-3.1-8b; [ $m = rank ] && model=/tmp/llama-8b-tp2-rank.json
  dir=$PWD; c=$LOOM_GIT_COMMIT; [ $tree = old ] && dir=$PWD/oldtree && c=2b28d78
  [ $tree = mid ] && dir=$PWD/midtree && c=f3bb3ee
  (cd $dir && LOOM_GIT_COMMIT=$c PYTHONPATH=/tmp/site:$dir timeout $(left $((150 + n * 80))) python3 -m loom.cli bench latency \
    --model $model $D --output-json $R/$m-$tree.json > $R/$m-$tree.log 2>&1)
  echo "$m-$tree rc $?: $(grep -E '^Decode' $R/$m-$tree.log | head -1 | cut -c1-150)"
  grep -E "decode_gemv" $R/$m-$tree.log | head -2 | cut -c1-220
done
stamp decode
timeout $(left 590) python3 -m pytest -q -p no:cacheprovider tests/e2e/test_gpu.py > $R/tests-e2e.log 2>&1
echo "e2e tests rc $?: $(tail -1 $R/tests-e2e.log)"; grep -E "^(FAILED|ERROR)" $R/tests-e2e.log | head -5
stamp done; tar czf $OUT/zzz24.tgz -C $R .
