# 1 GPU (~6 min), session 31: where PIECEWISE's and --enforce-eager's batch-1 decode spend
# their host time (cProfile and torch.profiler op tables of one more 128 -> 32 iteration,
# Llama-3.1-8B shapes, dummy weights), beside the default's figure; silu_mul alone at decode
# rows.
source benchmarks/gpu/env.sh; R=$OUT/zzz65; mkdir -p $R
timeout 60 python3 benchmarks/gpu/silu_mul_rows.py 2>&1 | tee $R/silu_mul.log | grep -v Warn; stamp silu
L="--model llama-3.1-8b --load-format dummy --input-len 128 --output-len 32 --num-iters-warmup 1 --num-iters 3 --batch-size 1"
run() {  # name, flags...
  local name=$1; shift
  [ $(left 500) -lt 60 ] && { echo "no time for $name"; return; }
  timeout $(left 520) $LOOM bench latency $L "$@" --output-json $R/lat-$name.json > $R/lat-$name.log 2>&1
  echo "$name rc $? $(grep -E '^Decode|^Avg' $R/lat-$name.log | cut -c1-60 | tr '\n' ' ')"; stamp $name
}
run full
run pw -O.cudagraph_mode=PIECEWISE --profile-host --profile --profile-result-dir $R/pw
run eager --enforce-eager --profile-host --profile --profile-result-dir $R/eager
rm -f $R/*/trace-rank*.json
tar czf $OUT/zzz65.tgz -C $R .
