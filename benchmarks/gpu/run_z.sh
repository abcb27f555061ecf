# x2 (~9.5 min), the first call of the next session (session 9 had no device time): what
# sessions 8 and 9 built without running it.
# 1. GPU tests: the Triton moe_align (fused MoE tests), the mixed-batch attention split, the
#    decode kernel rotating and caching the new tokens itself.
# 2. TP=2 decode 128 -> 128 (issue 4, 3.068 ms at 581d558): default; LOOM_DECODE_GEMV=1
#    (the Triton GEMV where the table says it beats cuBLAS, the down projection with its
#    SiLU·mul inside: ~0.29 + 0.05 ms expected); the GEMV
#    with the push all-reduce + norm and cuBLASLt preferred (3.030 / 3.016 ms alone).
#    The default now also has session 9's decode changes: one split is one kernel (no
#    reduce), and rotary + KV write happen inside the decode kernel (one launch a layer less).
# 3. Side by side. GPU0: gemv_bench at the 1-GPU shapes, --write-table into the tree, then
#    1-GPU decode default (4.480 ms at 936deda) and with LOOM_DECODE_ROPE_UNFUSED=1 (the
#    rotary fusion's share). GPU1:
#    Qwen3-30B-A3B decode (6.665 ms at 3485478 with the eager align; 4.334 traced), the MoE
#    call times, then 8B throughput at the default limits (1024 requests, 16384 tokens:
#    47.98 s at 3485478, 11% of prompts recomputed after preemptions) with the mixed-batch
#    attention split and the admission headroom (--kv-headroom-tokens 512: no preemption in
#    benchmarks/admission_sim.py, floors 31.85 -> 29.19 s).
source benchmarks/gpu/env.sh
R=/tmp/z; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout -s INT 100 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short -m gpu tests/kernels/test_fused_moe.py tests/kernels/test_paged_attention.py > $R/tests.log 2>&1; echo "rc=$?" >> $R/tests.log
grep -E "^(FAILED|ERROR|E  )|passed|failed|rc=" $R/tests.log | tail -8; stamp tests
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 80 $LOOM bench latency $D -tp 2 --output-json $R/tp2-decode.json > $R/tp2-decode.log 2>&1
LOOM_DECODE_GEMV=1 timeout 80 $LOOM bench latency $D -tp 2 --output-json $R/tp2-decode-gemv.json > $R/tp2-decode-gemv.log 2>&1
LOOM_DECODE_GEMV=1 LOOM_AR_NORM_PUSH=1 TORCH_BLAS_PREFER_CUBLASLT=1 timeout 80 $LOOM bench latency $D -tp 2 --output-json $R/tp2-decode-gemv-push-lt.json > $R/tp2-decode-gemv-push-lt.log 2>&1
for f in tp2-decode tp2-decode-gemv tp2-decode-gemv-push-lt; do echo "$f: $(grep -E '^Decode' $R/$f.log) $(grep -ho 'decode_gemv: [0-9]* matmuls.*' $R/$f.log | head -2)"; done; stamp "tp2 decode"
( export CUDA_VISIBLE_DEVICES=0
  timeout 100 python3 benchmarks/gpu/gemv_bench.py --output-json $R/gemv-tp1.json --shapes qkv1,o1,gate_up1,down1,lm_head1 --jobs 12 --budget-s 80 --write-table "loom/kernels/configs/gemv,dtype=bfloat16,device_name=NVIDIA_H200.json" > $R/gemv-tp1.log 2>&1
  cp "loom/kernels/configs/gemv,dtype=bfloat16,device_name=NVIDIA_H200.json" $R/gemv-table.json
  timeout $(left 480) $LOOM bench latency $D --output-json $R/tp1-decode.json > $R/tp1-decode.log 2>&1
  LOOM_DECODE_ROPE_UNFUSED=1 timeout $(left 560) $LOOM bench latency $D --output-json $R/tp1-decode-rope-unfused.json > $R/tp1-decode-rope-unfused.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 90 $LOOM bench latency --model qwen3-30b-a3b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3 --output-json $R/qwen3-decode.json > $R/qwen3-decode.log 2>&1
  timeout 40 $LOOM bench moe --model qwen3-30b-a3b --batch-sizes 1 8 64 512 4096 16384 --output-json $R/moe.json > $R/moe.log 2>&1
  timeout $(left 560) $LOOM bench throughput --model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown --output-json $R/throughput-8b.json > $R/thr8b.log 2>&1 ) &
wait
for f in $R/tp1-decode*.log $R/qwen3-decode.log $R/thr8b.log $R/moe.log; do echo "== $f"; grep -E "^(Decode|Throughput|Compute floor)|^  (decode only|with prompt)|decode_gemv:|preempt|^ *[0-9]+ .*us" $f | cut -c1-220 | head -10; done
grep -E "^(qkv1|o1|gate_up1|down1|lm_head1) " $R/gemv-tp1.log | head -15
tar czf $OUT/z.tgz -C $R . ; stamp done
