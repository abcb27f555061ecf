# 1 GPU (~2.5 min), session 11. Decode attention's splits merged by the last split program
# (one launch a layer; the reduce kernel took 2.3 us + a gap per layer in run_zj): the
# kernel tests on the GPU, then 1-GPU decode with it against LOOM_DECODE_REDUCE_KERNEL=1.
source benchmarks/gpu/env.sh
R=/tmp/zn; mkdir -p $R
timeout -s INT 75 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short tests/kernels/test_paged_attention.py tests/kernels/test_pdl.py > $R/tests.log 2>&1; echo "rc=$?" >> $R/tests.log
grep -E "^(FAILED|ERROR|E  )|passed|failed|rc=" $R/tests.log | tail -8; stamp tests
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
run() { name=$1; shift; env "$@" timeout 70 $LOOM bench latency $D --output-json $R/$name.json > $R/$name.log 2>&1; echo "$name: $(grep -E '^Decode' $R/$name.log | head -1)"; }
run tp1-fixup LOOM_DECODE_REDUCE_KERNEL=0
run tp1-reduce-kernel LOOM_DECODE_REDUCE_KERNEL=1
tar czf $OUT/zn.tgz -C $R . ; stamp done
