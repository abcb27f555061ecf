# 1 GPU (~9 min), session 40: after run_zzz93 (fp8 decode 2.796 ms/token, 1.30x its floor;
# prefill 8192 0.1522 s, no faster than run_zzz91's 0.1487 with the compiled quantization):
# 1. the per-channel fp8 GPU tests (model level, and the op's kernels), with the fp8 table
#    and the fp8 layers now built on meta and quantized a layer at a time (bea6339);
# 2. prefill 8192 and decode b1 under -q fp8 with --profile: the kernels by device time,
#    to see where prefill's 57 ms over the floor go (GEMMs, quantization, attention, norms).
source benchmarks/gpu/env.sh; R=$OUT/zzz94; mkdir -p $R
timeout $(left 170) python3 -m pytest -q tests/e2e/test_gpu.py tests/kernels/test_fp8_linear.py \
  -k "fp8" -p no:cacheprovider > $R/tests-gpu.log 2>&1
echo "tests rc $? $(tail -1 $R/tests-gpu.log)"; grep -E "^(FAILED|ERROR)" $R/tests-gpu.log | head -8
stamp tests
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 2 --num-iters 3 -q fp8 --profile"
run() {  # name, flags...
  local name=$1; shift
  [ $(left 520) -lt 60 ] && { echo "no time for $name"; return; }
  timeout $(left 530) $LOOM bench latency $L "$@" --profile-result-dir $R/prof-$name \
    --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|^Prefill' $R/$name.log | cut -c1-120 | tr '\n' ' ')"
  grep -A28 "^Profile of one" $R/$name.log | cut -c1-160
}
run prefill8192-fp8 --batch-size 1 --input-len 8192 --output-len 1
run b1-fp8 --batch-size 1 --input-len 128 --output-len 128
stamp latency
# 3. Llama-3.1-70B under -q fp8 on the one GPU (70.6 GB of fp8 weights; its bf16 copy of
#    141 GB could not be built before bea6339): load, peak memory, decode b1 32 -> 32.
if [ $(left 540) -gt 150 ]; then
  timeout $(left 550) $LOOM bench latency --model llama-3.1-70b --load-format dummy -q fp8 \
    --num-iters-warmup 1 --num-iters 2 --batch-size 1 --input-len 32 --output-len 32 \
    --output-json $R/70b-b1-fp8.json > $R/70b-b1-fp8.log 2>&1
  echo "70b rc $? $(grep -E '^Avg|^Decode|KV cache|blocks|memory' $R/70b-b1-fp8.log | cut -c1-150 | tr '\n' ' ')"
  tail -3 $R/70b-b1-fp8.log | cut -c1-300
fi
stamp 70b
rm -rf $R/prof-*
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz94.tgz -C $R .
