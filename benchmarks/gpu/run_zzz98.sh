# 1 GPU (~8 min), written in session 41 (no device lent) for the next session: the LoRA
# term at decode rows as two Triton kernels (loom/kernels/lora.py), with the decode GEMV
# pass handing it the norm or SiLU·mul that it fuses into the base projection.
# 1. the LoRA kernel tests on the GPU, and the LoRA e2e GPU tests;
# 2. 8B bf16 decode b1 128 -> 128: the base model, then every request on a random rank-16
#    adapter with this tree and with session 40's (81bc2af: four torch kernels a projection
#    and the norm no longer fused: 6.028 against 4.138 ms/token in run_zzz96). Expected:
#    ~4.9 ms/token (two launches a projection, ~3 us each, 4 projections x 32 layers);
# 3. the same at b8. Needs .whl/tree-81bc2af.tgz (git archive 81bc2af loom | gzip).
source benchmarks/gpu/env.sh; R=$OUT/zzz98; mkdir -p $R
timeout $(left 120) python3 -m pytest -q tests/kernels/test_lora_kernels.py -p no:cacheprovider \
  > $R/tests-kernels.log 2>&1
echo "kernel tests rc $? $(tail -1 $R/tests-kernels.log)"; grep -E "^(FAILED|ERROR)" $R/tests-kernels.log | head -4
timeout $(left 200) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider -k lora \
  > $R/tests-gpu.log 2>&1
echo "gpu tests rc $? $(tail -1 $R/tests-gpu.log)"; grep -E "^(FAILED|ERROR)" $R/tests-gpu.log | head -4
stamp tests
OLD=/tmp/old-tree; mkdir -p $OLD && tar xzf .whl/tree-81bc2af.tgz -C $OLD
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 2 --input-len 128 --output-len 128 --num-iters 4"
A="--enable-lora --max-lora-rank 16 --lora-path dummy"
run() {  # name, tree, flags...
  local name=$1 tree=$2; shift 2
  [ $(left 560) -lt 60 ] && { echo "no time for $name"; return; }
  local commit=$LOOM_GIT_COMMIT; [ $tree = $OLD ] && commit=81bc2af
  (cd $tree && LOOM_GIT_COMMIT=$commit PYTHONPATH=/tmp/site:$tree timeout $(left 570) python3 -m loom.cli bench latency \
    $L "$@" --output-json $R/$name.json > $R/$name.log 2>&1)
  echo "$name rc $? $(grep -E '^Avg|^Decode' $R/$name.log | cut -c1-120 | tr '\n' ' ')"
}
run b1 $PWD --batch-size 1
run b1-lora $PWD --batch-size 1 $A
run b1-lora-81bc2af $OLD --batch-size 1 $A
run b8-lora $PWD --batch-size 8 $A
run b8-lora-81bc2af $OLD --batch-size 8 $A
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz98.tgz -C $R .
