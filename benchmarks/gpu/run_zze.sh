# 1 GPU (~9 min), session 14. Qwen3-30B-A3B decode (3.114 ms/token in run_zza): Qwen3's q/k
# norm inside the rotary kernels (two Inductor norm kernels a layer fewer) and the router's
# GEMV routing its own batch (the route kernel's launch gone): two launches of ~2.5 us each
# and their gaps, ~0.25 ms a token expected. The tree before them (a68a6eb) in the same
# call, between two runs of this one. Needs a68a6eb's loom/ unpacked beside the tree:
#   git archive a68a6eb loom | tar -x -C old68
source benchmarks/gpu/env.sh
R=/tmp/zze; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 100 python3 -m pytest -v tests/kernels/test_moe_route.py tests/kernels/test_rope_kv_write.py > $R/tests-kernels.log 2>&1
timeout 60 python3 -m pytest -v -m gpu tests/kernels/test_paged_attention.py -k new_tokens > $R/tests-attention.log 2>&1
timeout 120 python3 -m pytest -v -m gpu tests/e2e/test_gpu.py > $R/tests-e2e.log 2>&1
for f in $R/tests-*.log; do echo "$f: $(grep -cE ' PASSED' $f) passed, $(grep -cE ' FAILED|ERROR' $f) failed"; grep -E 'FAILED|^E ' $f | head -5; done; stamp tests
D="--model qwen3-30b-a3b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 140 $LOOM bench latency $D --profile --profile-result-dir $R/prof --output-json $R/qwen3-decode.json > $R/qwen3-decode.log 2>&1
echo "new: $(grep -E '^Decode' $R/qwen3-decode.log | head -1)"
python3 benchmarks/gpu/decode_steps.py $R/prof --json $R/qwen3-decode-steps.json --sequence 40 > $R/qwen3-decode-steps.txt
head -22 $R/qwen3-decode-steps.txt | cut -c1-150; stamp "qwen3 decode, new"
[ -d old68/loom ] && (cd old68 && LOOM_GIT_COMMIT=a68a6eb PYTHONPATH=/tmp/site:$PWD timeout 120 $LOOM bench latency $D --output-json $R/qwen3-decode-a68a6eb.json > $R/qwen3-decode-a68a6eb.log 2>&1)
echo "a68a6eb: $(grep -E '^Decode' $R/qwen3-decode-a68a6eb.log | head -1)"; stamp "qwen3 decode, a68a6eb"
timeout $(left 560) $LOOM bench latency $D --output-json $R/qwen3-decode-again.json > $R/qwen3-decode-again.log 2>&1
echo "new again: $(grep -E '^Decode' $R/qwen3-decode-again.log | head -1)"; stamp "qwen3 decode, new again"
find $R -name 'trace-*.json' -size +20M -delete
tar czf $OUT/zze.tgz -C $R . ; stamp done
