# 1 GPU (~9 min), session 32, fast_launch on by default now (5b227b6). End to end, alternated
# in one call, LOOM_FAST_LAUNCH=0 (Triton's kernel[grid]) against the default: the
# 128-token prompt step alone under the default mode (piece graphs, 32 eager attention
# calls; --output-len 1) and batch-1 decode under PIECEWISE (128 -> 32). Then cProfile of
# the eager attention op at decode (prof_attention_op.py).
source benchmarks/gpu/env.sh; R=$OUT/zzz71; mkdir -p $R
timeout 60 python3 benchmarks/gpu/prof_attention_op.py 2>&1 | grep -v Warn | tee $R/prof_attention_op.log; stamp prof
L="--model llama-3.1-8b --load-format dummy --input-len 128 --num-iters-warmup 2 --num-iters 5 --batch-size 1"
run() {  # flag (0|1), name, flags...
  local fl=$1 name=$2; shift 2
  [ $(left 545) -lt 50 ] && { echo "no time for $fl $name"; return; }
  LOOM_FAST_LAUNCH=$fl timeout $(left 558) $LOOM bench latency $L "$@" --output-json $R/$name-fl$fl.json > $R/$name-fl$fl.log 2>&1
  echo "fl$fl $name rc $? $(grep -E '^Avg|^Decode' $R/$name-fl$fl.log | cut -c1-48 | tr '\n' ' ')"
}
i=0; for f in 0 1 1 0 0 1; do i=$((i+1)); run $f prefill$i --output-len 1; done; stamp prefill
i=0; for f in 1 0 0 1; do i=$((i+1)); run $f piecewise$i --output-len 32 -O '{"cudagraph_mode": "PIECEWISE"}'; done
stamp piecewise
tar czf $OUT/zzz71.tgz -C $R .
