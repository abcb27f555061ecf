# 1 GPU (~5 min), session 55, any card. Issue 3's throughput: can an SM partition hide a
# step's decode KV reads behind its GEMMs? First partition_probe (the GEMMs on a persistent
# Triton GEMM of sms - s programs beside the decodes' attention, against today's merged
# chain), then sm_bandwidth_probe (what s SMs read of HBM; a matmul beside them).
source benchmarks/gpu/env.sh; R=/tmp/zzz137; mkdir -p $R
timeout 300 python3 benchmarks/gpu/partition_probe.py $R/partition.json > $R/partition.log 2>&1
echo "partition rc $?"; grep -v -E "^(INFO|DEBUG|\[W)" $R/partition.log | tail -60
pack partition.json partition.log
stamp partition
timeout $(left 420) python3 benchmarks/gpu/sm_bandwidth_probe.py $R/sm-bw.json > $R/sm-bw.log 2>&1
echo "sm-bw rc $?"; grep -v -E "^(INFO|DEBUG|\[W)" $R/sm-bw.log | tail -12; pack sm-bw.json sm-bw.log
stamp done
