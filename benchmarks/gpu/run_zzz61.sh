# 1 GPU (~5 min), session 30: the compile level left unset is now 3 on CUDA (vLLM's
# default). The GPU tests that build an LLM with no level (test_gpu's "default" case, the
# bf16-vs-transformers test, the async engine), then 8B decode at batch 1, 128 -> 128, with
# no -O at all: its log must say level 3, and its figure sits beside the decode floor.
source benchmarks/gpu/env.sh; R=$OUT/zzz61; mkdir -p $R
timeout $(left 330) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py tests/e2e/test_async_engine.py \
  tests/worker/test_layer_clock.py > $R/tests.log 2>&1; echo "gpu tests rc $?"; tail -4 $R/tests.log; stamp tests
L="--model llama-3.1-8b --load-format dummy --input-len 128 --output-len 128 --num-iters-warmup 2 --num-iters 5"
timeout $(left 560) $LOOM bench latency $L --batch-size 1 --output-json $R/lat-default-b1.json > $R/lat-default-b1.log 2>&1
echo "default b1 rc $?"; grep -E "torch.compile level|Avg latency|^Decode|floor" $R/lat-default-b1.log | cut -c1-200; stamp latency
tar czf $OUT/zzz61.tgz -C $R .
