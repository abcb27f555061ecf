# 1 GPU (~8 min), session 16. The fused MoE's configs compiled at start-up (moe_warmup.py)
# and the warm-up's decode variants compiled on threads (compile_pool.py).
# 1. their GPU tests; 2. Qwen3's first step at seven prompt sizes, each twice: session 15's
# tree (old16/, f4a8566) then this one; 3. Qwen3 throughput: anything compiled mid-run?
source benchmarks/gpu/env.sh
R=/tmp/zzs; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 150 python3 -m pytest -q -m gpu tests/worker/test_moe_warmup.py tests/kernels/test_compile_pool.py \
  tests/kernels/test_jit_watch.py > $R/tests.log 2>&1
tail -3 $R/tests.log; stamp "gpu tests"
for tree in old16 new; do
  dir=$PWD; [ $tree = old16 ] && dir=$PWD/old16
  (cd $dir && timeout $(left 330) python3 $OLDPWD/benchmarks/gpu/step_size_probe.py --model qwen3-30b-a3b \
     --json $R/steps-$tree.json > $R/steps-$tree.log 2>&1)
  grep -E "warm-up|start-up|tokens, call" $R/steps-$tree.log | cut -c1-260
  stamp "step sizes, $tree"
done
T="--load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
timeout $(left 570) $LOOM bench throughput --model qwen3-30b-a3b $T --output-json $R/thr-qwen3.json > $R/thr-qwen3.log 2>&1
grep -E "warm-up" $R/thr-qwen3.log | cut -c1-300
grep -E "^(Throughput|  |Compute floor)" $R/thr-qwen3.log | grep -v "full collection walked" | cut -c1-240
echo "compiled while serving: $(grep -c 'compiled while serving' $R/thr-qwen3.log)"; grep "compiled while serving" $R/thr-qwen3.log | cut -c1-300 | head
stamp "qwen3 throughput"
tar czf $OUT/zzs.tgz -C $R . ; stamp done
