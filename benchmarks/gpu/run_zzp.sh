# 1 GPU (~5 min), session 15. run_zzo: no Triton compile left mid-run (8B), one (Qwen3), and
# the first prompt step 0.6-0.9 s against 2.2-2.6; but Python's collector paused the engine
# ~2 s a run (gen2: 16 collections, 1.0-1.2 s, up to 91 ms each), which matches the slowest
# decode steps (4-7x their median). Start-up now also freezes the scheduler's heap (its KV
# blocks, one object each, were built after the model runner froze its own), and the first
# two full collections say what they walk. Qwen3 then 8B throughput.
source benchmarks/gpu/env.sh
R=/tmp/zzp; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
T="--load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
for m in qwen3-30b-a3b llama-3.1-8b; do
  timeout $(left 560) $LOOM bench throughput --model $m $T --output-json $R/thr-$m.json > $R/thr-$m.log 2>&1
  grep -E "^(Throughput|  |Compute floor)" $R/thr-$m.log | cut -c1-400
  grep -c "compiled while serving" $R/thr-$m.log
  stamp "$m throughput"
done
tar czf $OUT/zzp.tgz -C $R . ; stamp done
