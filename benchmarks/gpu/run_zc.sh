# 1 GPU (~9 min), session 10's second call, after run_zb.sh found the GPU host without
# llguidance (now in ../shared/device/wheels.sh) and the fused-rope GPU test's rotary table
# too short for its 9000-token request.
# 1. The decode-with-new-tokens GPU tests again.
# 2. 1-GPU decode 128 -> 128 (4.480 ms at 936deda): one split = one kernel, rotary + KV write
#    inside the decode kernel.
# 3. 8B throughput at the defaults (47.98 s at 3485478, 11% of prompts recomputed) with the
#    mixed-batch attention split (1.9-2.2x faster mixed-step attention in run_zb) and the
#    admission headroom; then again with steps 40-42 under torch.profiler (where a prompt
#    step's time goes).
# 4. `loom bench attention --tune` at batch 1 and 8 (256 and 2048 tokens): the split count
#    and tiles of the latency path.
source benchmarks/gpu/env.sh
R=/tmp/zc; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout -s INT 60 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short -m gpu tests/kernels/test_paged_attention.py -k new_tokens > $R/tests.log 2>&1; echo "rc=$?" >> $R/tests.log
grep -E "^(FAILED|ERROR|E  )|passed|failed|rc=" $R/tests.log | tail -8; stamp tests
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 90 $LOOM bench latency $D --output-json $R/tp1-decode.json > $R/tp1-decode.log 2>&1
grep -E "^Decode|Avg latency" $R/tp1-decode.log; tail -3 $R/tp1-decode.log | cut -c1-200; stamp "tp1 decode"
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
timeout 170 $LOOM bench throughput $T --output-json $R/throughput-8b.json > $R/thr8b.log 2>&1
grep -E "^(Throughput|Compute floor|Prompt tokens computed)|^  (decode only|with prompt)|preempt" $R/thr8b.log | cut -c1-230; tail -2 $R/thr8b.log | cut -c1-200; stamp "throughput"
timeout $(left 490) $LOOM bench throughput $T --profile-steps 40 3 --profile-result-dir $R/prof-mixed --output-json $R/throughput-8b-prof.json > $R/thr8b-prof.log 2>&1
grep -E "^(Throughput|Compute floor|Prompt tokens computed)|^  (decode only|with prompt)" $R/thr8b-prof.log | cut -c1-230
grep -A22 "^Profile of" $R/thr8b-prof.log | cut -c1-180; stamp "throughput profiled"
timeout $(left 560) $LOOM bench attention --model llama-3.1-8b --batch-sizes 1 8 --context-lens 256 2048 --tune --tune-block-n 32 64 128 --tune-warps 4 8 --output-json $R/attention-b1.json > $R/attention-b1.log 2>&1
quiet < $R/attention-b1.log | tail -12 | cut -c1-200
tar czf $OUT/zc.tgz -C $R . ; stamp done
