# 1 GPU (~9 min), written in session 38 (no GPU was lent then): the GPU e2e tests, whole
# (LoRA's and speculative decoding's since e40cda2 have not run on a GPU), then what LoRA
# costs a decode. 8B dummy, 128 -> 128, batch 1 and 8, the base model against every request
# on a random rank-16 adapter (--lora-path dummy, 1 slot). Expected: the adapter's bytes
# (~84 MB bf16 against 16.06 GB of weights) move the floor by 0.5%; the rest of any gap is
# the LoRA term's 4 launches per projection (~512 kernels a step, in the CUDA graph).
source benchmarks/gpu/env.sh; R=$OUT/zzz89; mkdir -p $R
timeout $(left 300) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider \
  > $R/tests-gpu.log 2>&1; echo "test_gpu rc $? $(tail -1 $R/tests-gpu.log)"
stamp tests
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 3 --input-len 128 --output-len 128 --num-iters 8"
LORA="--enable-lora --max-lora-rank 16 --lora-path dummy"
run() {  # name, flags...
  local name=$1; shift
  [ $(left 560) -lt 60 ] && { echo "no time for $name"; return; }
  timeout $(left 570) $LOOM bench latency $L "$@" --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|ceiling' $R/$name.log | cut -c1-110 | tr '\n' ' ')"
}
run b1-lora --batch-size 1 $LORA
run b1 --batch-size 1
run b8-lora --batch-size 8 $LORA
run b8 --batch-size 8
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz89.tgz -C $R .
