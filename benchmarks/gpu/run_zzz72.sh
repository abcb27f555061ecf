# 1 GPU (~5 min), session 32: issue 3's standing figures at this session's HEAD (fast_launch
# on by default; eager norms do not run under the default's graphs): batch-1 decode 128 ->
# 128 and prefill 2048 / 8192 (--output-len 1), no -O.
source benchmarks/gpu/env.sh; R=$OUT/zzz72; mkdir -p $R
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 2 --batch-size 1"
run() {  # name, flags...
  local name=$1; shift
  [ $(left 470) -lt 50 ] && { echo "no time for $name"; return; }
  timeout $(left 480) $LOOM bench latency $L "$@" --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|^Prefill|ceiling' $R/$name.log | cut -c1-90 | tr '\n' ' ')"
}
run decode --input-len 128 --output-len 128 --num-iters 5
run prefill2048 --input-len 2048 --output-len 1 --num-iters 10
run prefill8192 --input-len 8192 --output-len 1 --num-iters 10
stamp latency
tar czf $OUT/zzz72.tgz -C $R .
