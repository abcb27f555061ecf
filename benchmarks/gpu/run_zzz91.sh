# 1 GPU (~9.5 min), session 39, first call of the session: the GPU tests of what is new
# since e40cda2 (LoRA, fp8 per-channel and block-wise, sliding windows through the Triton
# kernels: llama beside gemma3 and a windowed Mistral), the per-channel
# fp8 GEMM split into its parts (fp8_rowwise_probe: the block probe's "rowwise" included an
# eager five-kernel quantization), then 8B decode and prefill under --quantization fp8
# beside bf16. Floors (loom.bench.floors): fp8 reads 9.08 GB a decode step against bf16's
# 16.06 (2.18 vs 3.85 ms at 4.17 TB/s); prefill floors take the fp8 rate measured here.
source benchmarks/gpu/env.sh; R=$OUT/zzz91; mkdir -p $R
timeout $(left 230) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py tests/bench/test_floors_and_ceilings.py \
  -k "fp8 or lora or ceilings or (float32_equals_cpu and (default or full) and (llama or gemma3 or mistral))" \
  -p no:cacheprovider > $R/tests-gpu.log 2>&1
echo "tests rc $? $(tail -1 $R/tests-gpu.log)"; grep -E "^(FAILED|ERROR)" $R/tests-gpu.log | head -8
stamp tests
timeout $(left 290) python3 benchmarks/gpu/fp8_rowwise_probe.py > $R/rowwise.log 2>&1; echo "probe rc $?"
grep -E "M=(1|8192):" $R/rowwise.log | cut -c1-230
stamp probe
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 3 --num-iters 6"
run() {  # name, flags...
  local name=$1; shift
  [ $(left 560) -lt 70 ] && { echo "no time for $name"; return; }
  timeout $(left 570) $LOOM bench latency $L "$@" --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|^Prefill|ceiling' $R/$name.log | cut -c1-120 | tr '\n' ' ')"
}
run b1-fp8 --batch-size 1 --input-len 128 --output-len 128 -q fp8
run b1 --batch-size 1 --input-len 128 --output-len 128
run prefill8192-fp8 --batch-size 1 --input-len 8192 --output-len 1 -q fp8
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz91.tgz -C $R .
