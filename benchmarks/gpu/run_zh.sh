# 1 GPU (~8 min), the next session's call if only 1-GPU hosts are lent again.
# 0. The prefill kernel with its interior key tiles unmasked against every tile masked
#    (session 10, after the last call; 616 / 1547 us in run_zd at these shapes).
# 1. 8B throughput with decode-only steps 300-302 profiled (decode steps at 1.21x their
#    floors: GEMMs at ~480 rows, the KV reads), then with prompt steps 40-42 profiled at the
#    defaults and with LOOM_DECODE_GEMV=0 (run_zf: 42.51 against 41.65 s, prompt steps 1.38x
#    against 1.35x: is the opaque linear op costing prompt steps anything?).
# 2. Qwen3-30B-A3B throughput with prompt steps 40-42 profiled (2.26x their floors: the MoE).
source benchmarks/gpu/env.sh
R=/tmp/zh; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 60 $LOOM bench attention --model llama-3.1-8b --mode prefill --prompt-tokens 16384 --chunk-len 1024 --chunk-context 0 1024 --tune --tune-prefill-block-m 128 --tune-prefill-block-n 64 --tune-prefill-warps 4 8 --tune-prefill-stages 3 --tune-prefill-mask-all 0 1 --output-json $R/attention-prefill.json > $R/attention-prefill.log 2>&1
quiet < $R/attention-prefill.log | tail -5 | cut -c1-220; python3 -c "import json; [print(r['context_len'], [(c['config'], round(c['us'], 1)) for c in r['tuned']['top']]) for r in json.load(open('$R/attention-prefill.json'))['rows']]"; stamp "attention prefill"
T="--load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
timeout 120 $LOOM bench throughput --model llama-3.1-8b $T --profile-steps 300 3 --profile-result-dir $R/prof-8b-decode --output-json $R/thr8b-decode-prof.json > $R/thr8b-decode-prof.log 2>&1
timeout 120 $LOOM bench throughput --model llama-3.1-8b $T --profile-steps 40 3 --profile-result-dir $R/prof-8b-prompt --output-json $R/thr8b-prompt-prof.json > $R/thr8b-prompt-prof.log 2>&1
LOOM_DECODE_GEMV=0 timeout 120 $LOOM bench throughput --model llama-3.1-8b $T --profile-steps 40 3 --profile-result-dir $R/prof-8b-prompt-nogemv --output-json $R/thr8b-prompt-prof-nogemv.json > $R/thr8b-prompt-prof-nogemv.log 2>&1
timeout $(left 480) $LOOM bench throughput --model qwen3-30b-a3b $T --profile-steps 40 3 --profile-result-dir $R/prof-qwen3-prompt --output-json $R/qwen3-prof.json > $R/qwen3-prof.log 2>&1
for f in thr8b-decode-prof thr8b-prompt-prof thr8b-prompt-prof-nogemv qwen3-prof; do echo "== $f"; grep -E "^(Throughput|Compute floor|Profile of)|^  (decode only|with prompt|steps')" $R/$f.log | cut -c1-200; grep -A14 "^Profile of" $R/$f.log | tail -11 | cut -c1-160; done
tar czf $OUT/zh.tgz --exclude='trace-*.json' -C $R . ; stamp done
