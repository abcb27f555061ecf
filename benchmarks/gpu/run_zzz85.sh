# 1 GPU (~9 min), session 37: n-gram speculative decoding on the device. First its GPU
# tests (tiny llama, float32, drafts verified through piece graphs and FULL's mixed graphs,
# against the CPU) and two of test_gpu's standing cases (the step's inputs and read-back
# changed for everyone). Then 8B batch-1 decode 128 -> 128: greedy with and without
# drafts (k=4, n-grams 2..4), and at vLLM's temperature 1 with and without (the cost of
# drafting requests not running ahead when drafts are rarely found).
source benchmarks/gpu/env.sh; R=$OUT/zzz85; mkdir -p $R
timeout $(left 240) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider \
  -k "spec_decode or (float32_equals_cpu and llama- and (default or full))" > $R/tests-e2e.log 2>&1
echo "e2e gpu tests rc $?"; grep -E "passed|failed|FAIL|Error" $R/tests-e2e.log | tail -12; stamp e2e
SPEC='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 3 --batch-size 1 --input-len 128 --output-len 128 --num-iters 8"
run() {  # name, flags...
  local name=$1; shift
  [ $(left 560) -lt 45 ] && { echo "no time for $name"; return; }
  timeout $(left 575) $LOOM bench latency $L "$@" --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|^Speculative|ceiling' $R/$name.log | cut -c1-110 | tr '\n' ' ')"
}
run greedy --temperature 0
run greedy-spec --temperature 0 --speculative-config "$SPEC"
run t1-spec --speculative-config "$SPEC"
run t1
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz85.tgz -C $R .
