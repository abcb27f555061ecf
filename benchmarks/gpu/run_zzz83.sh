# Found: 7.0 s of capture either way (warm-up 10.0 / 9.6 s); 15a2007 reverted (fc06b60).
# 1 GPU (~4.5 min), session 35: cudagraph_mode FULL's cold capture with the packed prefill
# kernel's variants (one per mixed graph's request count) compiled side by side first
# (compiling_packed), against 40050d7's one-by-one compiles (run_zzz78: 24.1 s), each start
# on an empty Triton cache of its own; then the GPU tests of the change. Before the call:
# mkdir zz_old && git archive 40050d7 loom | tar x -C zz_old (untracked, carried with the tree)
source benchmarks/gpu/env.sh; R=$OUT/zzz83; mkdir -p $R
FULL='{"level": 3, "cudagraph_mode": "FULL", "cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]}'
L="--model llama-3.1-8b --load-format dummy --max-model-len 2048 --input-len 128 --output-len 8 --num-iters-warmup 1 --num-iters 2"
start() {  # name, PYTHONPATH's loom tree
  TRITON_CACHE_DIR=/tmp/triton-$1 PYTHONPATH=/tmp/site:$2 timeout $(left 200) $LOOM bench latency $L -O "$FULL" > $R/$1.log 2>&1
  echo "$1 rc $?: $(grep -E 'captured|warm-up:' $R/$1.log | sed 's/.*loom.worker.//' | cut -c1-150 | tr '\n' ' ')"; stamp $1
}
start new $PWD
start old $PWD/zz_old
timeout $(left 255) python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_packed_prefill.py \
  tests/e2e/test_gpu.py -k "compiled_on_threads or (full and llama)" > $R/tests.log 2>&1
echo "tests rc $?"; grep -E "passed|failed|FAIL|Error" $R/tests.log | tail -8; stamp tests
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz83.tgz -C $R .
