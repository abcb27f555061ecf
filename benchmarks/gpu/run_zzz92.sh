# 1 GPU (~9 min), session 40, first call: the GPU tests not yet run since their fixes
# (LoRA slots on the model's device and dtype, af20e16; per-channel fp8 holding logprobs
# only) and the float32 GPU comparison for the model families added in session 39
# (Qwen2-MoE, Phi-3, Gemma 2) in the default and FULL graph modes; then what LoRA costs a
# decode (run_zzz89's measurement, which could not run before af20e16). 8B dummy,
# 128 -> 128, batch 1 and 8, the base model against every request on a random rank-16
# adapter. Expected: the adapter's ~84 MB move the floor by 0.5%; the rest of any gap is
# the LoRA term's launches per projection (captured in the CUDA graph).
source benchmarks/gpu/env.sh; R=$OUT/zzz92; mkdir -p $R
timeout $(left 260) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider \
  -k "lora or fp8 or (float32_equals_cpu and (default or full) and (qwen2_moe or phi3 or gemma2))" \
  > $R/tests-gpu.log 2>&1
echo "tests rc $? $(tail -1 $R/tests-gpu.log)"; grep -E "^(FAILED|ERROR)" $R/tests-gpu.log | head -8
stamp tests
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 3 --input-len 128 --output-len 128 --num-iters 6"
LORA="--enable-lora --max-lora-rank 16 --lora-path dummy"
run() {  # name, flags...
  local name=$1; shift
  [ $(left 560) -lt 70 ] && { echo "no time for $name"; return; }
  timeout $(left 570) $LOOM bench latency $L "$@" --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|ceiling' $R/$name.log | cut -c1-110 | tr '\n' ' ')"
}
run b1-lora --batch-size 1 $LORA
run b1 --batch-size 1
run b8-lora --batch-size 8 $LORA
run b8 --batch-size 8
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz92.tgz -C $R .
