# 1 GPU (~3 min cold), session 26: the LL consumer GEMV with a copy of the summed row per
# program and a plain first read of the peer's words; then the whole chain probe again.
source benchmarks/gpu/env.sh; R=$OUT/zzz41; mkdir -p $R
timeout 120 python3 -m pytest -q tests/kernels/test_gemv_ll.py > $R/tests.log 2>&1
echo "tests rc $?"; tail -2 $R/tests.log; grep -E "FAILED|^E " $R/tests.log | head -12; stamp tests
timeout 150 python3 benchmarks/gpu/ll_consumer_probe.py $R/ll-consumer.json > $R/ll-consumer.log 2>&1
echo "probe rc $?"; quiet < $R/ll-consumer.log | cut -c1-200 | tail -20; stamp probe
timeout 200 python3 benchmarks/gpu/ll_gemv_probe.py $R/ll-gemv.json > $R/ll-gemv.log 2>&1
echo "ll probe rc $?"; quiet < $R/ll-gemv.log | cut -c1-300 | tail -10; stamp ll-probe
tar czf $OUT/zzz41.tgz -C $R .
