# 1 GPU (~4 min), session 12. The offline benchmarks now also hold the 8192^3 matmul 3 s and
# print each compute floor at that held rate beside the burst one (run_zq's gemm_probe: held
# 20 s it ran at 84% of its burst rate, the clocks lowered at the power limit). Prefill
# 8192 and 8B throughput with it.
source benchmarks/gpu/env.sh
R=/tmp/zv; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 60 python3 -m pytest -q -m gpu tests/bench/test_bench_offline.py -k ceilings > $R/tests.log 2>&1; tail -2 $R/tests.log
timeout 120 $LOOM bench latency --model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --input-len 8192 --output-len 1 --batch-size 1 --num-iters-warmup 3 --num-iters 10 -O 3 --output-json $R/prefill8192.json > $R/prefill8192.log 2>&1
grep -E "^(Prefill|Ceilings)" $R/prefill8192.log; stamp prefill
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
timeout $(left 330) $LOOM bench throughput $T --output-json $R/thr8b.json > $R/thr8b.log 2>&1
grep -E "^(Throughput|Compute floor|Ceilings)|^  (decode only|with prompt|steps')" $R/thr8b.log | cut -c1-220
tar czf $OUT/zv.tgz -C $R . ; stamp done
