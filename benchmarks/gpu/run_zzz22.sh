# 1 GPU (~8 min cold), session 21's closing checks after the audit fixes (frontend, CLI,
# CompilationConfig's `mode`, the engine processes' start-up signals):
# 1. the end-to-end GPU tests (GPU tokens = CPU reference, level 0 and 3; bf16 against
#    transformers; one-token batches) and the async engine's GPU test;
# 2. `loom serve` on 8B shapes at level 3: one chat request, then Ctrl-C: the exit code, any
#    process left, the GPU memory held after;
# 3. SIGTERM while the engine loads: every process gone and the GPU memory freed;
# 4. 8B batch-1 decode, against session 19-21's 4.28 ms/token.
source benchmarks/gpu/env.sh; R=$OUT/zzz22; mkdir -p $R
timeout 300 python3 -m pytest -q -m gpu tests/e2e/test_gpu.py tests/e2e/test_async_engine.py > $R/tests.log 2>&1
echo "tests rc $?: $(tail -1 $R/tests.log)"; grep -E "^(FAILED|ERROR)" $R/tests.log | head -5; stamp tests
gpu_mem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader; }
leftover() { pgrep -f "loom.cli|spawn_main|multiprocessing" | grep -v $$ | wc -l; }
S="--model llama-3.1-8b --load-format dummy --max-model-len 2048 -O 3 --port 8011"
setsid $LOOM serve $S > $R/serve.log 2>&1 & pid=$!
for i in $(seq 1 150); do curl -sf localhost:8011/health > /dev/null && break; sleep 1; done
echo "serve ready after ${i} s"
curl -s localhost:8011/v1/chat/completions -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":8,"ignore_eos":true}' | head -c 300; echo
kill -INT -$pid; t=$(date +%s); wait $pid; rc=$?
sleep 3; echo "Ctrl-C: rc $rc after $(( $(date +%s) - t )) s; leftover $(leftover); GPU memory $(gpu_mem)"
grep -c Traceback $R/serve.log; stamp serve
setsid $LOOM serve $S > $R/serve-term.log 2>&1 & pid=$!
sleep 25; echo "loading: GPU memory $(gpu_mem)"; kill -TERM $pid; t=$(date +%s); wait $pid; rc=$?
sleep 8; echo "SIGTERM at load: rc $rc after $(( $(date +%s) - t )) s; leftover $(leftover); GPU memory $(gpu_mem)"
grep -c Traceback $R/serve-term.log; tail -3 $R/serve-term.log | cut -c1-200; stamp sigterm
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout $(left 580) $LOOM bench latency $D --output-json $R/8b-decode.json > $R/8b-decode.log 2>&1
echo "8b decode rc $?: $(grep -E '^Decode' $R/8b-decode.log | head -1 | cut -c1-150)"
tar czf $OUT/zzz22.tgz -C $R .
