# 1 GPU (~9.5 min), session 10's third call.
# 1. GPU tests of the paged kernels (a wide decode batch now takes 128-key tiles 3 deep).
# 2. 1-GPU decode 128 -> 128: default (4.607 ms in run_zc, 4.480 at 936deda) against
#    LOOM_DECODE_ROPE_UNFUSED=1: is the rotary fusion the regression?
# 3. 8B throughput at the defaults (42.70 s in run_zc) with the wide decode tiles, and the
#    per-step floors (weights or FLOPs, + decodes' KV, + prompt attention).
# 4. Prompt attention: `loom bench attention --mode prefill --tune` at throughput's prompt
#    steps (16 fresh 1024-token prompts; 16 chunks after 1024 cached); the probe of PyTorch's
#    flash varlen attention against the paged kernel (run_zc's profile: the prefill kernel
#    at ~170 TFLOP/s in prompt steps).
# 5. If time is left: the GEMV table at the 1-GPU shapes, and decode with LOOM_DECODE_GEMV=1.
source benchmarks/gpu/env.sh
R=/tmp/zd; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout -s INT 60 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short -m gpu tests/kernels/test_paged_attention.py > $R/tests.log 2>&1; echo "rc=$?" >> $R/tests.log
grep -E "^(FAILED|ERROR|E  )|passed|failed|rc=" $R/tests.log | tail -8; stamp tests
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 80 $LOOM bench latency $D --output-json $R/tp1-decode.json > $R/tp1-decode.log 2>&1
LOOM_DECODE_ROPE_UNFUSED=1 timeout 80 $LOOM bench latency $D --output-json $R/tp1-decode-rope-unfused.json > $R/tp1-decode-rope-unfused.log 2>&1
for f in tp1-decode tp1-decode-rope-unfused; do echo "$f: $(grep -E '^Decode' $R/$f.log | head -1)"; done; stamp "tp1 decode"
timeout 150 $LOOM bench throughput --model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown --output-json $R/throughput-8b.json > $R/thr8b.log 2>&1
grep -E "^(Throughput|Compute floor|Prompt tokens computed)|^  (decode only|with prompt|steps')" $R/thr8b.log | cut -c1-250; tail -2 $R/thr8b.log | cut -c1-200; stamp "throughput"
timeout 30 python3 benchmarks/gpu/varlen_probe.py --output-json $R/varlen-probe.json > $R/varlen-probe.log 2>&1; tail -8 $R/varlen-probe.log | cut -c1-250; stamp "varlen probe"
timeout $(left 450) $LOOM bench attention --model llama-3.1-8b --mode prefill --prompt-tokens 16384 --chunk-len 1024 --chunk-context 0 1024 --tune --tune-prefill-block-n 64 128 --tune-prefill-stages 2 3 4 --output-json $R/attention-prefill.json > $R/attention-prefill.log 2>&1
quiet < $R/attention-prefill.log | tail -8 | cut -c1-220; stamp "attention prefill"
( export CUDA_VISIBLE_DEVICES=0
  timeout $(left 530) python3 benchmarks/gpu/gemv_bench.py --output-json $R/gemv-tp1.json --shapes qkv1,o1,gate_up1,down1,lm_head1 --jobs 12 --budget-s 60 --write-table "loom/kernels/configs/gemv,dtype=bfloat16,device_name=NVIDIA_H200.json" > $R/gemv-tp1.log 2>&1
  cp "loom/kernels/configs/gemv,dtype=bfloat16,device_name=NVIDIA_H200.json" $R/gemv-table.json
  LOOM_DECODE_GEMV=1 timeout $(left 590) $LOOM bench latency $D --output-json $R/tp1-decode-gemv.json > $R/tp1-decode-gemv.log 2>&1 )
grep -E "^(qkv1|o1|gate_up1|down1|lm_head1) " $R/gemv-tp1.log | head -12; echo "gemv: $(grep -E '^Decode' $R/tp1-decode-gemv.log | head -1) $(grep -ho 'decode_gemv: [0-9]* matmuls.*' $R/tp1-decode-gemv.log | head -1)"
tar czf $OUT/zd.tgz -C $R . ; stamp done
