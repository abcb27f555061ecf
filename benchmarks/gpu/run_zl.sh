# 1 GPU (~3.5 min), session 11. run_zk: PDL made 1-GPU decode slower (4.338 -> 4.439
# ms/token without prefetch, 5.496 with 24 MiB). Why: PDL without prefetch profiled (each
# kernel's time and the overlaps); a 2 MiB prefetch; loom's add + norm kernel without PDL
# (is it slower than Inductor's?); the baseline again for the noise.
source benchmarks/gpu/env.sh
R=/tmp/zl; mkdir -p $R
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
run() { name=$1; shift; env "$@" timeout 80 $LOOM bench latency $D --output-json $R/$name.json > $R/$name.log 2>&1; echo "$name: $(grep -E '^Decode' $R/$name.log | head -1)"; }
LOOM_PDL=1 timeout 100 $LOOM bench latency $D --profile --profile-result-dir $R/prof-pdl --output-json $R/tp1-pdl-prof.json > $R/tp1-pdl-prof.log 2>&1
echo "pdl profiled: $(grep -E '^Decode' $R/tp1-pdl-prof.log | head -1)"
python3 benchmarks/gpu/decode_steps.py $R/prof-pdl --json $R/tp1-pdl-steps.json --sequence 50 > $R/tp1-pdl-steps.txt; head -22 $R/tp1-pdl-steps.txt
run tp1-pdl-prefetch2 LOOM_PDL=1 LOOM_PDL_PREFETCH_MB=2
run tp1-addnorm-nopdl LOOM_TRITON_ADD_NORM=1
run tp1-default LOOM_PDL=0
find $R -name 'trace-*.json' -delete
tar czf $OUT/zl.tgz -C $R . ; stamp done
