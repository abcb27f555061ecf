# x2 (~9 min), the next session's first call if a 2-GPU host is lent (session 10 had only
# 1-GPU hosts). Issue 4's TP=2 decode (3.068 ms at 581d558, goal 2.6) with everything built
# since: the Triton GEMV now on by default (TP=2 table from run_x: ~0.29 ms expected), the
# down projection's SiLU·mul inside it (~0.05), rotary + KV write inside the decode kernel
# (~0.07; 1-GPU: 0.02 ms), one split = one kernel.
# 1. TP=2 decode at the defaults; with LOOM_DECODE_GEMV=0; with the push all-reduce + norm and
#    cuBLASLt preferred.
# 2. `loom bench attention -tp 2` at batch 1 (256 and 2048 tokens) with --tune: the split
#    count issue 4's decode takes (32 at max_model_len 2048) against the best.
# 2b. The prefill kernel with its interior key tiles unmasked against every tile masked
#    (session 10, after the last call; 616 / 1547 us in run_zd at these shapes).
# 3. Side by side: GPU0 8B throughput with decode-only steps 300-302 under the profiler (the
#    1.21x of decode steps: GEMMs at ~480 rows against the KV reads); GPU1 Qwen3-30B-A3B
#    throughput with prompt steps 40-42 profiled (prompt steps 2.26x their floors: the MoE).
source benchmarks/gpu/env.sh
R=/tmp/zg; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 90 $LOOM bench latency $D -tp 2 --output-json $R/tp2-decode.json > $R/tp2-decode.log 2>&1
LOOM_DECODE_GEMV=0 timeout 80 $LOOM bench latency $D -tp 2 --output-json $R/tp2-decode-nogemv.json > $R/tp2-decode-nogemv.log 2>&1
LOOM_AR_NORM_PUSH=1 TORCH_BLAS_PREFER_CUBLASLT=1 timeout 80 $LOOM bench latency $D -tp 2 --output-json $R/tp2-decode-push-lt.json > $R/tp2-decode-push-lt.log 2>&1
for f in tp2-decode tp2-decode-nogemv tp2-decode-push-lt; do echo "$f: $(grep -E '^Decode' $R/$f.log | head -1)"; done
grep -ho 'decode_gemv: [0-9]* matmuls.*' $R/tp2-decode.log | sort | uniq -c | head -4; stamp "tp2 decode"
CUDA_VISIBLE_DEVICES=0 timeout 60 $LOOM bench attention --model llama-3.1-8b -tp 2 --batch-sizes 1 --context-lens 256 2048 --tune --tune-block-n 32 64 128 --tune-warps 4 8 --output-json $R/attention-tp2-b1.json > $R/attention-tp2-b1.log 2>&1
quiet < $R/attention-tp2-b1.log | tail -6 | cut -c1-200; stamp "attention tp2"
CUDA_VISIBLE_DEVICES=0 timeout 60 $LOOM bench attention --model llama-3.1-8b --mode prefill --prompt-tokens 16384 --chunk-len 1024 --chunk-context 0 1024 --tune --tune-prefill-block-m 128 --tune-prefill-block-n 64 --tune-prefill-warps 4 8 --tune-prefill-stages 3 --tune-prefill-mask-all 0 1 --output-json $R/attention-prefill.json > $R/attention-prefill.log 2>&1
quiet < $R/attention-prefill.log | tail -5 | cut -c1-220; python3 -c "import json; [print(r['context_len'], [(c['config'], round(c['us'], 1)) for c in r['tuned']['top']]) for r in json.load(open('$R/attention-prefill.json'))['rows']]"; stamp "attention prefill"
T="--load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
( export CUDA_VISIBLE_DEVICES=0
  timeout $(left 560) $LOOM bench throughput --model llama-3.1-8b $T --profile-steps 300 3 --profile-result-dir $R/prof-8b-decode --output-json $R/throughput-8b-prof.json > $R/thr8b-prof.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout $(left 560) $LOOM bench throughput --model qwen3-30b-a3b $T --profile-steps 40 3 --profile-result-dir $R/prof-qwen3-prompt --output-json $R/qwen3-throughput-prof.json > $R/qwen3-thr-prof.log 2>&1 ) &
wait
for f in thr8b-prof qwen3-thr-prof; do echo "== $f"; grep -E "^(Throughput|Compute floor|Profile of)|^  (decode only|with prompt|steps')" $R/$f.log | cut -c1-200; grep -A14 "^Profile of" $R/$f.log | tail -11 | cut -c1-160; done
tar czf $OUT/zg.tgz --exclude='trace-*.json' -C $R . ; stamp done
