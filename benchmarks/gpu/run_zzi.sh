# 1 GPU (~8 min), session 14's last call. The decode kernel's split that holds the new
# token stores its key and value and attends over them from registers, with no barrier and
# reload, and every tile's values load before its scores (the decode kernel ran 6.1-6.7 us
# at 128-256 tokens of context in run_zzg, a chain of dependent loads). Against the tree
# before it (281c8ea) in the same call; needs its loom/ unpacked beside the tree:
#   git archive 281c8ea loom | tar -x -C oldH
# Result: no faster (decode kernel 6.9 us; Qwen3 3.090 against 3.091 ms/token, 8B 4.333
# against 4.307): taken out again; the change is in c9151f7.
source benchmarks/gpu/env.sh
R=/tmp/zzi; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 100 python3 -m pytest -v -m gpu tests/kernels/test_paged_attention.py tests/kernels/test_kv_cache_fp8.py -k "decode or new_tokens or fp8" > $R/tests-kernels.log 2>&1
timeout 90 python3 -m pytest -v -m gpu tests/e2e/test_gpu.py > $R/tests-e2e.log 2>&1
for f in $R/tests-*.log; do echo "$f: $(grep -c ' PASSED' $f) passed, $(grep -cE ' FAILED|ERROR' $f) failed"; grep -E 'FAILED|^E ' $f | head -5; done; stamp tests
D="--model qwen3-30b-a3b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
D8="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 120 $LOOM bench latency $D --profile --profile-result-dir $R/prof --output-json $R/qwen3-decode.json > $R/qwen3-decode.log 2>&1
echo "qwen3 new: $(grep -E '^Decode' $R/qwen3-decode.log | head -1)"
grep -E "_decode_split_kernel|_decode_reduce_kernel" $R/prof/ops-rank0.txt | sed -E 's/ +/ /g' | awk '{print $1, $(NF-1), $NF}'; stamp "qwen3 new"
old() { (cd oldH && LOOM_GIT_COMMIT=281c8ea PYTHONPATH=/tmp/site:$PWD timeout $1 $LOOM bench latency "${@:2}"); }
[ -d oldH/loom ] && old 100 $D --output-json $R/qwen3-decode-281c8ea.json > $R/qwen3-decode-281c8ea.log 2>&1
echo "qwen3 281c8ea: $(grep -E '^Decode' $R/qwen3-decode-281c8ea.log | head -1)"; stamp "qwen3 old"
timeout 90 $LOOM bench latency $D8 --output-json $R/llama8b-decode.json > $R/llama8b-decode.log 2>&1
echo "8b new: $(grep -E '^Decode' $R/llama8b-decode.log | head -1)"; stamp "8b new"
[ -d oldH/loom ] && old $(left 560) $D8 --output-json $R/llama8b-decode-281c8ea.json > $R/llama8b-decode-281c8ea.log 2>&1
echo "8b 281c8ea: $(grep -E '^Decode' $R/llama8b-decode-281c8ea.log | head -1)"; stamp "8b old"
find $R -name 'trace-*.json' -size +20M -delete
tar czf $OUT/zzi.tgz -C $R . ; stamp done
