# 1 GPU (~2 min cold), session 26: the LL consumer summing the peer's words inside its
# weight loop (LL_DEBUG=8) against the prologue form and the plain consumer; the chain.
source benchmarks/gpu/env.sh; R=$OUT/zzz42; mkdir -p $R
timeout 150 python3 benchmarks/gpu/ll_consumer_probe.py $R/ll-consumer.json > $R/ll-consumer.log 2>&1
echo "probe rc $?"; quiet < $R/ll-consumer.log | cut -c1-200 | tail -20; stamp probe
LL_DEBUG=8 timeout 200 python3 benchmarks/gpu/ll_gemv_probe.py $R/ll-gemv-inloop.json > $R/ll-gemv.log 2>&1
echo "ll probe rc $?"; quiet < $R/ll-gemv.log | cut -c1-300 | tail -10; stamp ll-probe
tar czf $OUT/zzz42.tgz -C $R .
