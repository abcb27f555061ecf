# 1 GPU (~9.5 min), session 10's first call: only nvidia-h200 was lent, so run_z/run_za's
# 1-GPU parts run here one after another and the TP=2 ones wait for a 2-GPU host.
# 1. GPU tests: the Triton moe_align, the mixed-batch attention split, the decode kernel that
#    rotates and caches the new tokens itself (sessions 8-9, never run on a GPU).
# 2. 1-GPU decode 128 -> 128 (4.480 ms at 936deda): one split is now one kernel, rotary + KV
#    write inside the decode kernel.
# 3. 8B throughput at the defaults (47.98 s at 3485478, 11% of prompts recomputed) with the
#    mixed-batch attention split and the admission headroom (512 tokens).
# 4. `loom bench attention`: the split-K decode kernel at throughput's decode shapes (~430
#    requests x ~1280 tokens; decode-only steps ran at 1.55x their floor) with --tune, then a
#    mixed step (decodes beside 8192 prompt tokens): the split path against one varlen launch.
source benchmarks/gpu/env.sh
R=/tmp/zb; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > $R/gpu.txt 2>&1
timeout -s INT 110 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short -m gpu tests/kernels/test_fused_moe.py tests/kernels/test_paged_attention.py > $R/tests.log 2>&1; echo "rc=$?" >> $R/tests.log
grep -E "^(FAILED|ERROR|E  )|passed|failed|rc=" $R/tests.log | tail -8; stamp tests
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 80 $LOOM bench latency $D --output-json $R/tp1-decode.json > $R/tp1-decode.log 2>&1
grep -E "^Decode|Avg latency" $R/tp1-decode.log; stamp "tp1 decode"
timeout 170 $LOOM bench throughput --model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown --output-json $R/throughput-8b.json > $R/thr8b.log 2>&1
grep -E "^(Throughput|Compute floor|Prompt tokens computed)|^  (decode only|with prompt)|preempt" $R/thr8b.log | cut -c1-230; stamp "throughput"
timeout $(left 470) $LOOM bench attention --model llama-3.1-8b --batch-sizes 430 1024 --context-lens 1280 --tune --tune-block-n 32 64 128 --tune-warps 4 8 --output-json $R/attention-decode.json > $R/attention-decode.log 2>&1
stamp "attention decode"
timeout $(left 560) $LOOM bench attention --model llama-3.1-8b --mode mixed --batch-sizes 256 430 --context-lens 1280 --output-json $R/attention-mixed.json > $R/attention-mixed.log 2>&1
for f in $R/attention-decode.log $R/attention-mixed.log; do echo "== $f"; quiet < $f | tail -22 | cut -c1-200; done
tar czf $OUT/zb.tgz -C $R . ; stamp done
