# 1 GPU (~4 min cold; 302 s of device time left), session 22, after run_zzz24: the norm
# fusion as first built (a pass over the rows for their RMS before the weight streamed) cost
# 1.7 us less at the rank's qkv at M=1 but 13 us more at its gate_up (dot tiles, 16 padded
# rows: 16 serial chunk loads), and the rank decoded at 2.844 ms/token against 2.577 without
# it. Now the GEMV sums the squares as it streams and scales its sums at the end.
# 1. norm_gemv_probe again; 2. the rank-shaped decode, this tree (new) against f3bb3ee
#    (mid: the attention merge, no norm fusion; ./midtree).
source benchmarks/gpu/env.sh; R=$OUT/zzz25; mkdir -p $R
timeout 70 python3 benchmarks/gpu/norm_gemv_probe.py $R/norm-gemv.json > $R/norm-gemv.log 2>&1
echo "probe rc $?"; grep -E "M=[124]: floor" $R/norm-gemv.log; stamp probe
python3 benchmarks/gpu/rank_config.py /tmp/llama-8b-tp2-rank.json
D="--load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
n=0
for tree in new mid; do
  n=$((n+1)); dir=$PWD; c=$LOOM_GIT_COMMIT; [ $tree = mid ] && dir=$PWD/midtree && c=f3bb3ee
  (cd $dir && LOOM_GIT_COMMIT=$c PYTHONPATH=/tmp/site:$dir timeout $(left $((90 + n * 75))) python3 -m loom.cli bench latency \
    --model /tmp/llama-8b-tp2-rank.json $D --output-json $R/rank-$tree.json > $R/rank-$tree.log 2>&1)
  echo "rank-$tree rc $?: $(grep -E '^Decode' $R/rank-$tree.log | head -1 | cut -c1-150)"
  grep -E "decode_gemv" $R/rank-$tree.log | tail -1 | cut -c60-260
done
stamp done; tar czf $OUT/zzz25.tgz -C $R .
