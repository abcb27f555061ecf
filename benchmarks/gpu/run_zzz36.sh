# 1 GPU (~5 min cold), session 25: the GEMV that all-reduces its own input (issue 4's
# TP=2 decode lever, LOOM_GEMV_ALL_REDUCE=1), on the one GPU lent.
# 1. GPU tests: the all-reducing GEMV (two ranks' calls at once on two streams of one GPU,
#    eager and replayed from CUDA graphs), the GEMV's own tests (every shipped config), PDL;
# 2. ar_gemv_probe: a TP=2 rank's qkv / gate_up, the fusion's cost a call beside the add +
#    norm GEMV and the two kernels it replaces, the exchange aside;
# 3. (DECODE=1) 8B decode at TP=1, 128 -> 128: the GEMV kernel changed (the prefetch no longer needs
#    PDL): unchanged is ~4.1 ms/token (run_zzz27).
source benchmarks/gpu/env.sh; R=$OUT/zzz36; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
timeout 240 python3 -m pytest -q tests/kernels/test_all_reduce_gemv.py ${TESTS-tests/kernels/test_gemv_kernel.py tests/kernels/test_pdl.py} > $R/tests.log 2>&1
echo "tests rc $?"; tail -3 $R/tests.log; grep -E "FAILED|^E " $R/tests.log | head -12; stamp tests
timeout 150 python3 benchmarks/gpu/ar_gemv_probe.py $R/ar-gemv.json > $R/ar-gemv.log 2>&1
echo "probe rc $?"; quiet < $R/ar-gemv.log | cut -c1-300 | tail -8; stamp probe
# PROBES: ';'-separated "name args..." (a name "prefetchN" sets LOOM_PDL_PREFETCH_MB=N)
IFS=';' read -ra VARIANTS <<< "${PROBES:-prefetch4}"
for v in "${VARIANTS[@]}"; do
  set -- $v; name=$1; shift
  [ "$name" = "${name#prefetch}" ] && mb=0 || mb=${name#prefetch}
  LOOM_PDL_PREFETCH_MB=$mb timeout 150 python3 benchmarks/gpu/ar_gemv_probe.py $R/ar-gemv-$name.json "$@" > $R/ar-gemv-$name.log 2>&1
  echo "probe ($name) rc $?"; quiet < $R/ar-gemv-$name.log | cut -c1-300 | tail -8; stamp probe-$name
done
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
[ -n "$DECODE" ] && timeout $(left 560) $LOOM bench latency $D --output-json $R/decode-8b.json > $R/decode-8b.log 2>&1
echo "decode rc $?"; grep -E "^(Avg latency|Decode)" $R/decode-8b.log | head -3; stamp decode
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz36.tgz -C $R .
