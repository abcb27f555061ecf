# 1 GPU (~3 min), session 33: where a 128-token prompt step's 6.6-7.0 ms go (run_zzz75),
# under -O FULL (one whole-forward graph) and the default (piece graphs): torch.profiler of
# one iteration under FULL (the GPU's kernels against the step), cProfile of one iteration
# each way.
source benchmarks/gpu/env.sh; R=$OUT/zzz76; mkdir -p $R
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 3 --num-iters 5 --output-len 1 --input-len 128 --batch-size 1"
F='{"cudagraph_mode": "FULL"}'
timeout 150 $LOOM bench latency $L -O "$F" --profile --profile-host --profile-result-dir $R/prof-full --output-json $R/full.json 2>&1 | quiet > $R/full.log
echo "full rc $? $(grep -E '^Avg' $R/full.log)"; stamp full
timeout 150 $LOOM bench latency $L --profile-host --profile-result-dir $R/prof-default --output-json $R/default.json 2>&1 | quiet > $R/default.log
echo "default rc $? $(grep -E '^Avg' $R/default.log)"; stamp default
find $R -size +3M -print -delete; ls -la $R/prof-* | head
tar czf $OUT/zzz76.tgz -C $R .
