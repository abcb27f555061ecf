# 1 GPU (~5 min), session 12. Throughput's prompt steps run at 1.39x their floors, their
# GEMMs at ~84% of the matmul ceiling where an 8192-token prefill's reach ~95% (run_zq's
# gemm_probe.py asks why). 8B throughput at the defaults, then with LOOM_PAD_TOKENS=256
# (prompt steps padded to a multiple of 256 rows: at most 1/64 more rows).
source benchmarks/gpu/env.sh
R=/tmp/zp; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
timeout 260 $LOOM bench throughput $T --output-json $R/thr8b.json > $R/thr8b.log 2>&1
LOOM_PAD_TOKENS=256 timeout $(left 570) $LOOM bench throughput $T --output-json $R/thr8b-pad256.json > $R/thr8b-pad256.log 2>&1
for f in thr8b thr8b-pad256; do echo "== $f"; grep -E "^(Throughput|Compute floor)|^  (decode only|with prompt|steps')" $R/$f.log | cut -c1-200; done
tar czf $OUT/zp.tgz -C $R . ; stamp done
