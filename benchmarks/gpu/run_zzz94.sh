# 1 GPU (~8 min), session 40: after run_zzz93 (fp8 decode 2.796 ms/token, 1.30x its floor;
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
rm -rf $R/prof-*
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz94.tgz -C $R .
