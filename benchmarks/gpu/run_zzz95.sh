# 1 GPU (~6 min), session 40: Llama-3.1-70B under -q fp8 on one H200 ran at 2.03x its decode
# floor in run_zzz94 (34.6 ms/token against 17.07): no GEMV table has its shapes, so decode
# took cuBLASLt's fp8 GEMM at one row (~37% of the copy rate in run_zzz91). gemv_bench
# --weight-dtype fp8 measures its four projection shapes at one row and writes them into the
# fp8 table; then the same decode again. Expected ~1.2-1.3x (8B's fp8 decode: 1.30x).
source benchmarks/gpu/env.sh; R=$OUT/zzz95; mkdir -p $R
TABLE=loom/kernels/configs/gemv,dtype=float8_e4m3fn,device_name=NVIDIA_H200.json
timeout $(left 200) python3 benchmarks/gpu/gemv_bench.py --weight-dtype fp8 \
  --shapes qkv70,o70,gate_up70,down70 --ms 1 --budget-s 110 \
  --output-json $R/gemv-fp8-70b.json --write-table $TABLE > $R/gemv-fp8-70b.log 2>&1
echo "gemv_bench rc $?"; quiet < $R/gemv-fp8-70b.log | tail -12 | cut -c1-170; cp $TABLE $R/fp8-table.json
stamp gemv_bench
timeout $(left 450) $LOOM bench latency --model llama-3.1-70b --load-format dummy -q fp8 \
  --num-iters-warmup 1 --num-iters 2 --batch-size 1 --input-len 32 --output-len 32 \
  --output-json $R/70b-b1-fp8.json > $R/70b-b1-fp8.log 2>&1
echo "70b rc $? $(grep -E '^Avg|^Decode' $R/70b-b1-fp8.log | cut -c1-150 | tr '\n' ' ')"
stamp 70b
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz95.tgz -C $R .
