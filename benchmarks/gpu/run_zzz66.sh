# 1 GPU (~1 min), session 31: host time per call of an eagerly run decode layer's launches
# (benchmarks/gpu/launch_cost.py), to place PIECEWISE's and --enforce-eager's host-bound
# decode (run_zzz65).
source benchmarks/gpu/env.sh; R=$OUT/zzz66; mkdir -p $R
timeout 240 python3 benchmarks/gpu/launch_cost.py 2>&1 | tee $R/launch_cost.log | grep -v Warn; stamp launch_cost
