# 1 GPU (~7 min), session 37: speculative decoding, where its verify steps' time goes.
# test_gpu's llama float32 cases (the step's inputs and read-back changed for every path),
# then 8B batch-1 greedy decode with drafts under -O FULL once more (one LM head pass for
# the bonus and the drafts' rows now), profiled on the device and on the host; greedy at
# batch 8 with and without drafts (FULL; the verify steps' 40 tokens captured); batch 1
# with drafts in the default mode (verify steps in piece graphs).
source benchmarks/gpu/env.sh; R=$OUT/zzz87; mkdir -p $R
timeout $(left 170) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider -k "float32_equals_cpu and llama or spec_decode" > $R/tests-e2e.log 2>&1
echo "e2e gpu tests rc $?"; grep -E "passed|failed|FAIL|Error" $R/tests-e2e.log | tail -12; stamp e2e
SPEC='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
FULL='{"cudagraph_mode": "FULL"}'
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 3 --input-len 128 --output-len 128 --num-iters 8 --temperature 0"
run() {  # name, flags...
  local name=$1; shift
  [ $(left 420) -lt 45 ] && { echo "no time for $name"; return; }
  timeout $(left 430) $LOOM bench latency $L "$@" --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|^Speculative|ceiling' $R/$name.log | cut -c1-110 | tr '\n' ' ')"
}
run b1-spec-full-prof --batch-size 1 --speculative-config "$SPEC" -O "$FULL" --profile --profile-host --profile-result-dir $R/prof
run b8-spec-full --batch-size 8 --speculative-config "$SPEC" -O "$FULL"
run b8-full --batch-size 8 -O "$FULL"
run b1-spec --batch-size 1 --speculative-config "$SPEC"
stamp latency
rm -rf $R/prof/*.json $R/prof/*.gz 2>/dev/null; ls $R/prof
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz87.tgz -C $R .
