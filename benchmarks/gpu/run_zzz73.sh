# 1 GPU (~4 min), session 32: run_zzz72's prefill 2048 took 0.0499 s (0.0477 in session 24's
# run_zzz32). LOOM_FAST_LAUNCH=0 against the default, alternated, as many as fit.
source benchmarks/gpu/env.sh; R=$OUT/zzz73; mkdir -p $R
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 2 --batch-size 1 --input-len 2048 --output-len 1 --num-iters 10"
i=0; for f in 1 0 1 0; do i=$((i+1))
  [ $(left 225) -lt 62 ] && { echo "no time for run $i"; break; }
  LOOM_FAST_LAUNCH=$f timeout $(left 228) $LOOM bench latency $L --output-json $R/prefill$i-fl$f.json > $R/prefill$i-fl$f.log 2>&1
  echo "fl$f run $i rc $? $(grep -E '^Prefill' $R/prefill$i-fl$f.log | cut -c1-100)"; stamp run$i
done
tar czf $OUT/zzz73.tgz -C $R .
