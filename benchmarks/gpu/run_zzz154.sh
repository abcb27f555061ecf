# 1 GPU (~4 min), session 63 (run again with two level 1 cycles and host copy rates):
# sleep mode (enable_sleep_mode) on CUDA. Its memory is the
# driver's virtual memory API through ctypes: do the regions map, free and map again at the
# same addresses, with CUDA graphs and compiled code intact? The GPU test, then 8B shapes.
source benchmarks/gpu/env.sh; R=/tmp/zzz154; mkdir -p $R
gpu_tests sleep_tests 200 -vv tests/e2e/test_gpu_sleep.py
timeout $(left 520) python3 benchmarks/gpu/sleep_probe.py --json $R/sleep-8b.json > $R/sleep-8b.log 2>&1
echo "probe rc $?"; grep -vE "^(INFO|DEBUG)|it/s\]" $R/sleep-8b.log | tail -12 | cut -c1-300
pack sleep-8b.json sleep-8b.log
stamp done
