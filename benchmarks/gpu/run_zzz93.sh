# 1 GPU (~9 min), session 40: fp8 decode through loom::fp8_linear (the GEMV on the fp8
# weight at decode rows, cc5ea07; the pass fusing the norm and SiLU·mul into it, 24587ad).
# 1. the fp8 kernel tests and the per-channel fp8 GPU test;
# 2. gemv_bench --weight-dtype fp8 for 8B's TP=1 shapes, writing the fp8 decode table;
# 3. 8B decode b1 128 -> 128 under -q fp8 (with that table) beside bf16, and prefill 8192.
# Floors: fp8 reads 9.08 GB a step (2.14 ms at 4.24 TB/s). Expected: ~2.4-2.7 ms/token
# (GEMV at ~85% of copy on 6.98 GB of fp8 projections, the bf16 lm_head, attention) against
# run_zzz91's 4.85; prefill 8192 faster than 0.1487 s by the down projection's quantization
# (1340 us a layer compiled, ~100 us expected from the one-pass Triton kernel).
source benchmarks/gpu/env.sh; R=$OUT/zzz93; mkdir -p $R
timeout $(left 120) python3 -m pytest -q tests/kernels/test_fp8_linear.py tests/kernels/test_gemv_kernel.py \
  tests/kernels/test_gemv_norm.py tests/e2e/test_gpu.py -k "fp8" -p no:cacheprovider > $R/tests-gpu.log 2>&1
echo "tests rc $? $(tail -1 $R/tests-gpu.log)"; grep -E "^(FAILED|ERROR)" $R/tests-gpu.log | head -8
stamp tests
TABLE=loom/kernels/configs/gemv,dtype=float8_e4m3fn,device_name=NVIDIA_H200.json
timeout $(left 300) python3 benchmarks/gpu/gemv_bench.py --weight-dtype fp8 \
  --shapes qkv1,o1,gate_up1,down1,down1+silu --ms 1,2,4 --budget-s 120 \
  --output-json $R/gemv-fp8.json --write-table $TABLE > $R/gemv-fp8.log 2>&1
echo "gemv_bench rc $?"; quiet < $R/gemv-fp8.log | tail -22 | cut -c1-170; cp $TABLE $R/ 2>/dev/null
stamp gemv_bench
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 3 --num-iters 6"
run() {  # name, flags...
  local name=$1; shift
  [ $(left 560) -lt 60 ] && { echo "no time for $name"; return; }
  timeout $(left 570) $LOOM bench latency $L "$@" --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|^Prefill|ceiling' $R/$name.log | cut -c1-120 | tr '\n' ' ')"
  grep -E "fp8|GEMV|decode_gemv" $R/$name.log | grep -v -E "it/s\]|s/it\]" | cut -c1-200 | head -4
}
run b1-fp8 --batch-size 1 --input-len 128 --output-len 128 -q fp8
run prefill8192-fp8 --batch-size 1 --input-len 8192 --output-len 1 -q fp8
run b1 --batch-size 1 --input-len 128 --output-len 128
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz93.tgz -C $R .
