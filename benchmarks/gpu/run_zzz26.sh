# 1 GPU (~8-9 min cold), session 23: is the residual add + RMSNorm inside the qkv GEMV
# (LOOM_DECODE_NORM_GEMV=1, session 22's final form: unsplit row-reduction configs only) a
# win end to end? Decode batch 1, 128 -> 128, level 3, fusion on (norm1) against off (norm0),
# alternated: the TP=2-rank-shaped model twice each, then Llama-3.1-8B.
# The pool now mostly lends H100s, for which loom ships no GEMV table: on a GPU without
# one, gemv_bench first measures one (the rank's shapes, then 8B's) into $OUT, and the runs
# read it through LOOM_MOE_CONFIG_DIR.
source benchmarks/gpu/env.sh; R=$OUT/zzz26; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))")
TABLE="gemv,dtype=bfloat16,device_name=$GPU.json"; echo "GPU $GPU"
if [ ! -f "loom/kernels/configs/$TABLE" ]; then
  mkdir -p /tmp/cfg; cp loom/kernels/configs/*.json /tmp/cfg/
  timeout 120 python3 benchmarks/gpu/gemv_bench.py --output-json $R/gemv-rank.json --jobs 14 --budget-s 70 \
    --write-table "/tmp/cfg/$TABLE" > $R/gemv-rank.log 2>&1; echo "gemv rank rc $?"; stamp gemv-rank
  timeout 120 python3 benchmarks/gpu/gemv_bench.py --output-json $R/gemv-tp1.json --jobs 14 --budget-s 70 \
    --shapes qkv1,o1,gate_up1,down1,lm_head1 --write-table "/tmp/cfg/$TABLE" > $R/gemv-tp1.log 2>&1
  echo "gemv tp1 rc $?"; stamp gemv-tp1
  grep -E "eff" $R/gemv-rank.log $R/gemv-tp1.log | head -40; cp "/tmp/cfg/$TABLE" $R/
  export LOOM_MOE_CONFIG_DIR=/tmp/cfg; runs="rank:1 rank:0 8b:1 8b:0 rank:1 rank:0"
else
  runs="rank:1 rank:0 rank:1 rank:0 8b:1 8b:0 8b:1 8b:0"
fi
python3 benchmarks/gpu/rank_config.py /tmp/llama-8b-tp2-rank.json
D="--load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
n=0
for spec in $runs; do
  m=${spec%:*}; fuse=${spec#*:}; n=$((n+1))
  model=llama-3.1-8b; [ $m = rank ] && model=/tmp/llama-8b-tp2-rank.json
  [ $(left 530) -lt 70 ] && { echo "no time for $m-norm$fuse ($n)"; break; }
  LOOM_DECODE_NORM_GEMV=$fuse timeout $(left 590) $LOOM bench latency --model $model $D \
    --output-json $R/$m-norm$fuse-$n.json > $R/$m-norm$fuse-$n.log 2>&1
  echo "$m-norm$fuse-$n rc $?: $(grep -E '^Decode' $R/$m-norm$fuse-$n.log | head -1 | cut -c1-150)"
  grep -E "decode_gemv" $R/$m-norm$fuse-$n.log | tail -1 | cut -c60-260; stamp $m-norm$fuse-$n
done
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
