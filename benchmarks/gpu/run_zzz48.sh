# 1 GPU (~2 min cold), session 27: the all-reduce + norm kernels trap after their poll
# limit. run_zzz37's steps (the LL and one-rank GPU tests, PDL's offline compiles, then
# ar_norm_probe: pull, push and LL with both ranks on one GPU, to set beside run_zzz45's)
# plus tests/kernels/test_collective_give_up.py (one rank alone traps), into $OUT/zzz48.
TESTS="tests/kernels/test_all_reduce_norm_kernel.py tests/kernels/test_pdl.py tests/kernels/test_collective_give_up.py" \
Z=zzz48 exec bash benchmarks/gpu/run_zzz37.sh
