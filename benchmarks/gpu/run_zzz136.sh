# 1 GPU (~1.5 min), session 54: sm_bandwidth_probe alone (run_zzz135's first part), what s
# SMs read of HBM and a matmul beside them, the bound on an SM partition of a mixed step.
source benchmarks/gpu/env.sh; R=/tmp/zzz136; mkdir -p $R
timeout 120 python3 benchmarks/gpu/sm_bandwidth_probe.py $R/sm-bw.json > $R/sm-bw.log 2>&1
echo "probe rc $?"; grep -v -E "^(INFO|DEBUG|\[W)" $R/sm-bw.log | tail -12; pack sm-bw.json sm-bw.log
stamp done
