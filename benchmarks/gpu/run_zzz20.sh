# 1 GPU (~7 min cold), session 21. Only the 1-GPU kind is lent again, so:
# 1. GPU checks of three refactors (behaviour unchanged): the GEMV and paged-decode kernels'
#    GPU tests, `loom bench moe` timing three batch sizes and tuning one;
# 2. issue 4's decode budget without a 2-GPU host: Llama-3.1-8B's decode beside a model of
#    one TP=2 rank's shapes (16 query / 4 KV heads, intermediate 7168, vocab 64128, so every
#    GEMM is a rank's shard) with no collective at all. What the rank alone takes leaves
#    (2.6 ms - it) / 64 per all-reduce for the goal.
source benchmarks/gpu/env.sh; R=$OUT/zzz20; mkdir -p $R
timeout 170 python3 -m pytest -q -m gpu tests/kernels/test_gemv_kernel.py \
  tests/kernels/test_paged_attention.py tests/kernels/test_paged_attention_rope.py > $R/tests.log 2>&1
echo "tests rc $?: $(tail -1 $R/tests.log)"; grep -E "^(FAILED|ERROR)" $R/tests.log | head -5; stamp tests
timeout $(left 300) $LOOM bench moe --batch-sizes 1 64 1024 --output-json $R/moe.json > $R/moe.log 2>&1
echo "moe rc $?"; grep -E "^M=|ceilings" $R/moe.log | cut -c1-160
timeout $(left 400) $LOOM bench moe --batch-sizes 64 --tune --save-dir $R/tuned > $R/moe-tune.log 2>&1
echo "moe tune rc $?"; grep -E "^M=|compiled in|Wrote" $R/moe-tune.log | cut -c1-160; stamp moe
python3 - <<'PY'
import json
c = json.load(open("loom/bench/configs/llama-3.1-8b.json"))
c.update(num_attention_heads=16, num_key_value_heads=4, head_dim=128, intermediate_size=7168,
         vocab_size=64128)
json.dump(c, open("/tmp/llama-8b-tp2-rank.json", "w"), indent=1)
PY
D="--load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
for m in llama-3.1-8b /tmp/llama-8b-tp2-rank.json; do
  n=$(basename $m .json)
  timeout $(left 590) $LOOM bench latency --model $m $D --output-json $R/$n.json > $R/$n.log 2>&1
  echo "$n rc $?: $(grep -E '^Decode' $R/$n.log | head -1)"; grep -E "floor|weights" $R/$n.log | head -3 | cut -c1-160
done
stamp decode; tar czf $OUT/zzz20.tgz -C $R .
