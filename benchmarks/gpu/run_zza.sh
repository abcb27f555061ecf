# 1 GPU (~9 min), session 13. Qwen3-30B-A3B decode after run_zz (3.963 ms/token with the
# MoE's GEMV kernels): the routing in one kernel (torch.topk took 10.7 us a layer), the
# Triton GEMV table extended to Qwen3's attention, router and LM head shapes, the MoE's
# GEMV entries now in the shipped table. Then Qwen3 throughput (41.72 s at ab4b373).
source benchmarks/gpu/env.sh
R=/tmp/zza; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 100 python3 -m pytest -q -m gpu tests/kernels/test_moe_route.py tests/kernels/test_fused_moe.py tests/e2e/test_gpu.py > $R/tests.log 2>&1; tail -2 $R/tests.log; stamp tests
timeout 110 python3 benchmarks/gpu/gemv_bench.py --output-json $R/gemv-q3.json --shapes q3_qkv,q3_o,q3_router,q3_lm_head --jobs 12 --budget-s 70 --write-table "loom/kernels/configs/gemv,dtype=bfloat16,device_name=NVIDIA_H200.json" > $R/gemv-q3.log 2>&1
grep -E "^ *(q3_|shape|wrote|Wrote)" $R/gemv-q3.log | cut -c1-160 | head -20; cp "loom/kernels/configs/gemv,dtype=bfloat16,device_name=NVIDIA_H200.json" $R/; stamp gemv
D="--model qwen3-30b-a3b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 130 $LOOM bench latency $D --profile --profile-result-dir $R/prof --output-json $R/qwen3-decode.json > $R/qwen3-decode.log 2>&1
echo "decode: $(grep -E '^Decode' $R/qwen3-decode.log | head -1)"
python3 benchmarks/gpu/decode_steps.py $R/prof --json $R/qwen3-decode-steps.json --sequence 50 > $R/qwen3-decode-steps.txt
head -24 $R/qwen3-decode-steps.txt | cut -c1-150; stamp "qwen3 decode"
T="--model qwen3-30b-a3b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
timeout $(left 560) $LOOM bench throughput $T --output-json $R/qwen3-thr.json > $R/qwen3-thr.log 2>&1
grep -E "^(Throughput|Compute floor|Ceilings)|^  (decode only|with prompt|steps')" $R/qwen3-thr.log | cut -c1-220
find $R -name 'trace-*.json' -size +20M -delete
tar czf $OUT/zza.tgz -C $R . ; stamp done
