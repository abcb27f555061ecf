# 1 GPU (~8 min), session 45: the int4 kernel's unpacking, conversions and tiles.
# 1. tests/kernels/test_int4_linear.py (the three conversions bit for bit, on sm_90's own
#    bf16 arithmetic) and test_int8_linear.py (the SiLU test, now to a few ulps);
# 2. benchmarks/gpu/int4_tune.py on 8B's projections: unpacking whole or by slabs, and
#    convert 0/1/2, at decode tiles; the decode grid at M = 1 (then 16); prompt tiles at
#    M = 64 and 256 against the dequantize + dense GEMM path and bf16. Offline PTX: slabs
#    with convert 2 halve the decode step's instructions (531 against 994) and drop the
#    per-value cvt.rn.bf16.s32 and 16-bit shared stores. Decode expected far nearer the
#    copy rate: qkv's 12.6 MB at ~3 TB/s is ~4 us, against 37 us at de41cb4.
source benchmarks/gpu/env.sh; R=$OUT/zzz107; mkdir -p $R
timeout $(left 100) python3 -m pytest -q tests/kernels/test_int4_linear.py -k "conversions or \
  configs" tests/kernels/test_int8_linear.py -p no:cacheprovider > $R/kernels.log 2>&1
echo "kernel tests rc $? $(tail -1 $R/kernels.log)"; grep -E "^(FAILED|E  )" $R/kernels.log | head -12
stamp tests
timeout $(left 560) python3 benchmarks/gpu/int4_tune.py --budget-s $(left 480) \
  --out $R/int4-tune.json 2>&1 | grep -v -E "^(INFO|DEBUG)" > $R/int4-tune.log
echo "tune rc $?"; grep -E "^\S|\[convert\]|\[decode\]|\[decode16\]|\[prompt\]|bf16|budget" $R/int4-tune.log | cut -c1-190 | head -120
stamp tune
