# 1 GPU (~2 min cold), session 26: where the LL consumer GEMV's time goes.
source benchmarks/gpu/env.sh; R=$OUT/zzz40; mkdir -p $R
timeout 120 python3 -m pytest -q tests/kernels/test_gemv_ll.py > $R/tests.log 2>&1
echo "tests rc $?"; tail -2 $R/tests.log; grep -E "FAILED|^E " $R/tests.log | head -12; stamp tests
timeout 200 python3 benchmarks/gpu/ll_consumer_probe.py $R/ll-consumer.json > $R/ll-consumer.log 2>&1
echo "probe rc $?"; quiet < $R/ll-consumer.log | cut -c1-200 | tail -20; stamp probe
tar czf $OUT/zzz40.tgz -C $R .
