# Not run in session 47 (failed starts spent its device time): run it first next session.
# 1 GPU (~3 min), session 47: the fused MoE at decode sizes after run_zzz113 (the integer
# GEMV 2.8-3.9x faster than its former form on an H100) showed that an untuned GPU never
# reached it: without a table the defaults took the grouped GEMM's 16-row tiles (Qwen3-30B-A3B
# GPTQ-Int4 decode at batch 1: 4.343 ms/token, 4.89x its floor). Now the defaults take the
# GEMV where the tokens leave each expert half a row or less, and the tuner's GEMV grid has
# 1-8 warps with chunks sized per weight bytes (int4 chunks up to 32768 values).
# 1. Qwen3 int4 decode at batch 1 with the new defaults (no table on an H100), profiled:
#    int4 decode at 4.343 ms/token was no faster than bf16's 4.18 on an H100 in run_zzz30;
# 2. Qwen3 bf16 decode at batch 1 on the new defaults (an H100 has no bf16 table either).
# The tuner's wider GEMV grid is left for a later run: failed starts spent the device time.
source benchmarks/gpu/env.sh; R=$OUT/zzz114; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
L="--load-format dummy --num-iters-warmup 2 --num-iters 4 --input-len 128 --output-len 128 --batch-size 1"
q3() {  # q3 NAME MODEL DEADLINE [CONFIG_DIR [FLAGS]]
  LOOM_MOE_CONFIG_DIR=$4 timeout $(left $3) $LOOM bench latency --model $2 $L $5 \
    --output-json $R/q3-$1.json > $R/q3-$1.log 2>&1
  echo "q3-$1 rc $?: $(grep -E '^Decode|fused_moe' $R/q3-$1.log | cut -c1-170 | tr '\n' ' ')"
  stamp q3-$1
}
q3 int4-default qwen3-30b-a3b-gptq-int4 95 "" "--profile --profile-result-dir $R/prof"
grep -A36 "^Profile of one" $R/q3-int4-default.log | cut -c1-190; rm -rf $R/prof
q3 bf16-default qwen3-30b-a3b 165  # bf16 experts on the new defaults (GEMV at decode)
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
