# 1 GPU (~3 min), session 37: speculative decoding with nothing running ahead while any
# step in flight verifies drafts (run_zzz87: batch 8 under FULL split into alternating
# halves, 4.81 against 4.62 ms/token without drafts). 8B greedy batch 8 with drafts under
# -O FULL, profiled; batch 1 at temperature 1 (drafts never found) with and without.
source benchmarks/gpu/env.sh; R=$OUT/zzz88; mkdir -p $R
SPEC='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
FULL='{"cudagraph_mode": "FULL"}'
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 3 --input-len 128 --output-len 128 --num-iters 8"
run() {  # name, flags...
  local name=$1; shift
  [ $(left 300) -lt 40 ] && { echo "no time for $name"; return; }
  timeout $(left 310) $LOOM bench latency $L "$@" --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|^Speculative|ceiling' $R/$name.log | cut -c1-110 | tr '\n' ' ')"
}
run b8-spec-full --batch-size 8 --temperature 0 --speculative-config "$SPEC" -O "$FULL" --profile --profile-result-dir $R/prof
run b1-t1-spec --batch-size 1 --speculative-config "$SPEC"
run b1-t1 --batch-size 1
stamp latency
rm -rf $R/prof/*.json $R/prof/*.gz 2>/dev/null
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz88.tgz -C $R .
