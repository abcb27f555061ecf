# x2, first call of a session: GPU tests (GPU0 1-GPU tests; then TP tests) beside the decode A/B on GPU1
source benchmarks/gpu/env.sh
R=/tmp/a; mkdir -p $R
M8="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
# The kernel tests run on CUDA tensors here (no gpu marker: the same tests run interpreted on CPU).
( export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/kernels tests/worker/test_sampler_kernel_path.py > $R/tests1.log 2>&1; echo "rc=$?" >> $R/tests1.log
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/e2e >> $R/tests1.log 2>&1; echo "rc=$?" >> $R/tests1.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 120 $LOOM bench latency $M8 --profile --profile-result-dir $R/prof --output-json $R/decode-new.json > $R/decode-new.log 2>&1
  for V in LOOM_SAMPLER_KERNEL; do
    env $V=0 timeout 90 $LOOM bench latency $M8 --output-json $R/decode-no-$V.json > $R/decode-no-$V.log 2>&1
  done ) &
wait
stamp phase1; grep -E "passed|failed|rc=" $R/tests1.log
for f in $R/decode-*.log; do echo "$f: $(grep -E '^Decode' $f)"; done
grep -A 30 "Profile of one" $R/decode-new.log | cut -c1-82,150-260 | head -32
timeout $(( 590 - ($(date +%s) - T0) )) python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/distributed tests/compilation > $R/tests2.log 2>&1; tail -3 $R/tests2.log
tar czf $OUT/a.tgz -C $R . ; stamp done
