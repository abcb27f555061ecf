# 1 GPU (~9 min), written in session 40 for the next session (not yet run):
# 1. gemv_bench --weight-dtype fp8 at 8 and 16 rows for 8B's TP=1 shapes (decode steps of
#    5-16 rows take cuBLASLt today) and at 1-4 rows for 8B's TP=2 shapes (which take the bf16
#    table's tiles at twice the chunk width, unmeasured), merged into the fp8 table;
# 2. 8B -q fp8 prefill 8192 with the down projection's rows quantized inside SiLU·mul
#    (75186c6) and, since session 41, qkv's and gate_up's rows quantized inside the add +
#    norm (expected together ~5 ms under run_zzz94's 0.1499 s) and decode b8 128 -> 128
#    beside bf16 b8 (fp8 reads 9.08 GB a step against 16.06).
# 0. first the fp8 kernel tests on the GPU (the add + norm + quantize kernel is new).
source benchmarks/gpu/env.sh; R=$OUT/zzz97; mkdir -p $R
timeout $(left 60) python3 -m pytest -q tests/kernels/test_fp8_linear.py -p no:cacheprovider \
  > $R/tests-fp8.log 2>&1
echo "fp8 kernel tests rc $? $(tail -1 $R/tests-fp8.log)"; grep -E "^(FAILED|ERROR)" $R/tests-fp8.log | head -4
TABLE=loom/kernels/configs/gemv,dtype=float8_e4m3fn,device_name=NVIDIA_H200.json
timeout $(left 170) python3 benchmarks/gpu/gemv_bench.py --weight-dtype fp8 \
  --shapes qkv1,o1,gate_up1,down1 --ms 8,16 --budget-s 110 \
  --output-json $R/gemv-fp8-rows.json --write-table $TABLE > $R/gemv-fp8-rows.log 2>&1
echo "gemv_bench rows rc $?"; quiet < $R/gemv-fp8-rows.log | tail -10 | cut -c1-170
timeout $(left 330) python3 benchmarks/gpu/gemv_bench.py --weight-dtype fp8 \
  --shapes qkv,o_proj,gate_up,down --ms 1,2,4 --budget-s 110 \
  --output-json $R/gemv-fp8-tp2.json --write-table $TABLE > $R/gemv-fp8-tp2.log 2>&1
echo "gemv_bench tp2 rc $?"; quiet < $R/gemv-fp8-tp2.log | tail -10 | cut -c1-170
cp $TABLE $R/fp8-table.json; stamp gemv_bench
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 2 --num-iters 4"
run() {  # name, flags...
  local name=$1; shift
  [ $(left 560) -lt 70 ] && { echo "no time for $name"; return; }
  timeout $(left 570) $LOOM bench latency $L "$@" --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|^Prefill' $R/$name.log | cut -c1-120 | tr '\n' ' ')"
}
run prefill8192-fp8 --batch-size 1 --input-len 8192 --output-len 1 -q fp8
run b8-fp8 --batch-size 8 --input-len 128 --output-len 128 -q fp8
run b8 --batch-size 8 --input-len 128 --output-len 128
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz97.tgz -C $R .
