# 1 GPU (~4 min), session 40: run_zzz92's LoRA part, shortened to the device time left: the
# LoRA GPU tests (slots on the model's device and dtype since af20e16, never run on a GPU)
# and 8B decode b1 128 -> 128 with every request on a random rank-16 adapter, beside the
# base model. Expected: the adapter's ~84 MB move the floor by 0.5%; the rest of any gap is
# the LoRA term's launches per projection (captured in the CUDA graph).
source benchmarks/gpu/env.sh; R=$OUT/zzz96; mkdir -p $R
timeout $(left 100) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider -k lora \
  > $R/tests-gpu.log 2>&1
echo "tests rc $? $(tail -1 $R/tests-gpu.log)"; grep -E "^(FAILED|ERROR)" $R/tests-gpu.log | head -4
stamp tests
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 2 --input-len 128 --output-len 128 --num-iters 4 --batch-size 1"
for name in b1-lora b1; do
  [ $(left 330) -lt 60 ] && { echo "no time for $name"; continue; }
  extra=""; [ $name = b1-lora ] && extra="--enable-lora --max-lora-rank 16 --lora-path dummy"
  timeout $(left 340) $LOOM bench latency $L $extra --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode' $R/$name.log | cut -c1-130 | tr '\n' ' ')"
done
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz96.tgz -C $R .
