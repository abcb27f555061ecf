# 1 GPU (~2 min cold), session 26: the LL all-reduce + norm with every load that does not
# wait for the peer issued first; against pull and push as in run_zzz37 and run_zzz44.
# The steps are run_zzz37's (GPU tests, then ar_norm_probe), into $OUT/zzz45.
Z=zzz45 exec bash benchmarks/gpu/run_zzz37.sh
