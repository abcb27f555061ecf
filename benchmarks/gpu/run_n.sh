# 1 GPU (~7 min): short prefills are host-bound (a 128-token prefill took 33 ms for ~5 ms of
# GPU work at eb80c49). The dynamic graph's prefill at 128, 512 and 2048 tokens with SDPA
# (the default) against loom's paged prefill kernel (LOOM_SDPA_MIN_TOKENS=4096), one engine
# start each; the first 128-token pair under the profiler too, for the host time per layer.
source benchmarks/gpu/env.sh
R=/tmp/n; mkdir -p $R
B="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --output-len 1 --batch-size 1 --num-iters-warmup 3 --num-iters 10 -O 3"
for N in 128 512 2048; do for S in 0 4096; do
  LEFT=$(( 585 - ($(date +%s) - T0) )); [ $LEFT -lt 40 ] && break 2
  EXTRA=""; [ $N = 128 ] && EXTRA="--profile --profile-result-dir $R/prof-$N-$S"
  LOOM_SDPA_MIN_TOKENS=$S timeout $LEFT $LOOM bench latency $B --input-len $N $EXTRA --output-json $R/prefill$N-sdpa$S.json > $R/prefill$N-sdpa$S.log 2>&1
  echo "$N tokens, LOOM_SDPA_MIN_TOKENS=$S: $(grep -E '^Avg' $R/prefill$N-sdpa$S.log)"
done; done
# Decode with cuBLASLt preferred (PyTorch's TORCH_BLAS_PREFER_CUBLASLT): does its heuristic
# skip the split-K reduce kernels cuBLAS adds to o_proj and down (2 of ~12 small kernels a layer)?
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
for L in 0 1; do
  LEFT=$(( 585 - ($(date +%s) - T0) )); [ $LEFT -lt 60 ] && break
  TORCH_BLAS_PREFER_CUBLASLT=$L timeout $LEFT $LOOM bench latency $D --output-json $R/decode-cublaslt$L.json > $R/decode-cublaslt$L.log 2>&1
  echo "decode, TORCH_BLAS_PREFER_CUBLASLT=$L: $(grep -E '^Decode' $R/decode-cublaslt$L.log)"
done
rm -f $R/prof-*/trace-rank*.json
tar czf $OUT/n.tgz -C $R . ; stamp done
