# 1 GPU (~1.5 min), session 63: sleep mode's GPU tests after d294959 (a region unmaps and
# frees its address range when its model runner goes: after LLM.shutdown the memory is the
# driver's again).
source benchmarks/gpu/env.sh; R=/tmp/zzz156; mkdir -p $R
gpu_tests sleep_tests 200 -vv tests/e2e/test_gpu_sleep.py
