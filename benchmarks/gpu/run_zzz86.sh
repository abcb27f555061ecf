# 1 GPU (~8 min), session 37: speculative decoding after drafting requests may run ahead
# (drafts from the host's tokens, guessing the one in flight). Its GPU tests again, then
# 8B batch-1 decode 128 -> 128: at vLLM's temperature 1 (drafts rarely found) with and
# without, alternated; greedy (drafts nearly always accepted) with and without under
# -O FULL, whose mixed graphs take the 5-token verify steps (piece graphs in run_zzz85).
source benchmarks/gpu/env.sh; R=$OUT/zzz86; mkdir -p $R
timeout $(left 200) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider -k "spec_decode" > $R/tests-e2e.log 2>&1
echo "e2e gpu tests rc $?"; grep -E "passed|failed|FAIL|Error" $R/tests-e2e.log | tail -12; stamp e2e
SPEC='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 3 --batch-size 1 --input-len 128 --output-len 128 --num-iters 8"
run() {  # name, flags...
  local name=$1; shift
  [ $(left 560) -lt 45 ] && { echo "no time for $name"; return; }
  timeout $(left 575) $LOOM bench latency $L "$@" --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|^Speculative|ceiling' $R/$name.log | cut -c1-110 | tr '\n' ' ')"
}
run t1-spec --speculative-config "$SPEC"
run t1
run greedy-spec-full --temperature 0 --speculative-config "$SPEC" -O '{"cudagraph_mode": "FULL"}'
run greedy-full --temperature 0 -O '{"cudagraph_mode": "FULL"}'
run t1-spec-b --speculative-config "$SPEC"
run t1-b
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz86.tgz -C $R .
