# 1 GPU (~6 min cold), session 21. run_zzz20 found one TP=2 rank's decode work alone (no
# collective) at 2.540 ms/token, 1.33x its weight floor, where the whole 8B decodes at 1.12x:
# the 2.6 ms goal of issue 4 would leave < 1 us per all-reduce. Where do a rank's 0.63 ms go?
# 1. the rank-shaped model's decode under the profiler (ops by device time, idle gaps);
# 2. the same with LOOM_PDL=1 (the chain of small kernels is what PDL overlaps; at 8B shapes
#    it lost in session 11, before the GEMV's tuned configs);
# 3. 8B's profile and PDL beside it, for the same table at full shapes.
source benchmarks/gpu/env.sh; R=$OUT/zzz21; mkdir -p $R
python3 - <<'PY'
import json
c = json.load(open("loom/bench/configs/llama-3.1-8b.json"))
c.update(num_attention_heads=16, num_key_value_heads=4, head_dim=128, intermediate_size=7168,
         vocab_size=64128)
json.dump(c, open("/tmp/llama-8b-tp2-rank.json", "w"), indent=1)
PY
D="--load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
run() {  # name deadline model env... [-- extra flags]
  n=$1; dl=$2; m=$3; shift 3
  env "$@" timeout $(left $dl) $LOOM bench latency --model $m $D $X --output-json $R/$n.json > $R/$n.log 2>&1
  echo "$n rc $?: $(grep -E '^Decode' $R/$n.log | head -1 | cut -c1-120)"
}
X="--profile --profile-result-dir /tmp/prof-rank" run rank-profile 170 /tmp/llama-8b-tp2-rank.json LOOM_PDL=0
X="" run rank-pdl 280 /tmp/llama-8b-tp2-rank.json LOOM_PDL=1
X="--profile --profile-result-dir /tmp/prof-8b" run 8b-profile 420 llama-3.1-8b LOOM_PDL=0
X="" run 8b-pdl 570 llama-3.1-8b LOOM_PDL=1
stamp runs
for p in rank 8b; do
  timeout 30 python3 benchmarks/gpu/trace_gaps.py /tmp/prof-$p --top 8 > $R/$p-gaps.txt 2>&1; head -12 $R/$p-gaps.txt
done
tar czf $OUT/zzz21.tgz -C $R .
