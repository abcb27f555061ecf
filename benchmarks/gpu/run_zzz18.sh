# 1 GPU (~9 min), session 20. run_zzz17 again with keep_guards matching PyTorch 2.11's guard
# text ("2 <= L['input_ids'].size()[0] <= 2147483647": run_zzz17's new tree still traced
# batch 1 a second time, so its A/B measured nothing), in one call with run_zzz16's served
# A/B and the gemv_bench smoke run:
#  1. start-up and batch-1 decode: old (every guard kept) cold, new warm, old warm;
#  2. the lone-request GPU test (batch 1 from the general graph against the CPU);
#  3. served 4000-token prompts at 5 QPS, the context rule on, then off (run_zzz16.sh);
#  (gemv_bench.py's smoke run passed in the first try of this script: NO_GEMV)
source benchmarks/gpu/env.sh
R=$OUT/zzz18; mkdir -p $R
OLD=/tmp/oldtree; rm -rf $OLD; mkdir -p $OLD; cp -r loom $OLD/
sed -i 's/    return keep$/    return [True for _ in entries]/' $OLD/loom/compilation/backend.py
grep -c "return \[True for _ in entries\]" $OLD/loom/compilation/backend.py
D="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5"
O='{"level":3,"cudagraph_capture_sizes":[1,2,4,8,16,24,32,40,48,56,64]}'
one() {  # name deadline tree
  local t=$(date +%s)
  ( cd $3 && TORCH_LOGS=recompiles PYTHONPATH=/tmp/site:$3 timeout $(left $2) python3 -m loom.cli \
    bench latency $D -O "$O" --output-json $R/$1.json > $R/$1.log 2>&1 )
  echo "$1: wall $(( $(date +%s) - t )) s; $(grep -E '^Decode' $R/$1.log | cut -c1-60)"
  grep -E "captured [0-9]+ CUDA graphs|torch.compile level|level 3: split|shape guards" $R/$1.log | cut -c1-200
  grep -A3 -E "Recompiling function" $R/$1.log | cut -c1-240 | head -8; stamp "$1"
}
one old-cold 90 $OLD
one new-warm 135 $PWD
one old-warm 195 $OLD
timeout $(left 280) python3 -m pytest -q -x -m gpu tests/e2e/test_gpu.py -k lone -p no:cacheprovider \
  > $R/tests.log 2>&1; echo "tests rc=$?"; tail -n 2 $R/tests.log; stamp tests
tar czf $OUT/zzz18.tgz -C $R .
NO_GEMV=1 bash benchmarks/gpu/run_zzz16.sh ctx oneshot
