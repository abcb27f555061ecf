# 1 GPU (~2 min cold), session 26: the LL all-reduce + norm recording its epoch without a
# counter at batch 1 (one program), against pull and push as in run_zzz37.
# The steps are run_zzz37's (GPU tests, then ar_norm_probe), into $OUT/zzz44.
Z=zzz44 exec bash benchmarks/gpu/run_zzz37.sh
