# 1 GPU (~6 min), session 11. Programmatic dependent launch (loom/kernels/pdl.py) in the
# decode chain: run_zj's 1-GPU step is 273 kernels, ~0.4 us gaps, and latency-bound
# kernels between the GEMVs (decode attention 6.0 + 2.3 us a layer at 256 tokens, Inductor
# norms 2.1 / 2.7 us) during which the memory system idles. With PDL each GEMV starts
# early and asks its first weights into L2 while its predecessor finishes.
# 1. GPU tests of the kernels (PDL on by default where sm_90) and greedy tokens.
# 2. 1-GPU decode 128 -> 128: LOOM_PDL=0; default (PDL, 24 MiB prefetch); PDL without
#    prefetch; LOOM_TRITON_ADD_NORM=1 (add + norm in loom's PDL kernel, not Inductor's);
#    the same with 48 MiB; then the norm variant profiled (decode_steps.py --sequence).
source benchmarks/gpu/env.sh
R=/tmp/zk; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout -s INT 150 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short tests/kernels/test_pdl.py tests/kernels/test_gemv_kernel.py tests/kernels/test_all_reduce_norm_kernel.py tests/kernels/test_paged_attention.py tests/e2e/test_gpu.py > $R/tests.log 2>&1; echo "rc=$?" >> $R/tests.log
grep -E "^(FAILED|ERROR|E  )|passed|failed|rc=" $R/tests.log | tail -12; stamp tests
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
run() { name=$1; shift; env "$@" timeout 80 $LOOM bench latency $D --output-json $R/$name.json > $R/$name.log 2>&1; echo "$name: $(grep -E '^Decode' $R/$name.log | head -1)"; }
run tp1-pdl0 LOOM_PDL=0
run tp1-pdl LOOM_PDL=1
run tp1-pdl-noprefetch LOOM_PDL_PREFETCH_MB=0
run tp1-pdl-addnorm LOOM_TRITON_ADD_NORM=1
run tp1-pdl-addnorm-48 LOOM_TRITON_ADD_NORM=1 LOOM_PDL_PREFETCH_MB=48
stamp "tp1 decode"
LOOM_TRITON_ADD_NORM=1 timeout $(left 560) $LOOM bench latency $D --profile --profile-result-dir $R/prof-tp1 --output-json $R/tp1-pdl-addnorm-prof.json > $R/tp1-prof.log 2>&1
python3 benchmarks/gpu/decode_steps.py $R/prof-tp1 --json $R/tp1-decode-steps.json --sequence 50 > $R/tp1-decode-steps.txt
head -28 $R/tp1-decode-steps.txt
find $R -name 'trace-*.json' -delete
tar czf $OUT/zk.tgz -C $R . ; stamp done
