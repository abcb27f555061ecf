# 1 GPU (~4.5 min), session 47: the fused MoE at decode sizes after run_zzz113 (the integer
# GEMV 2.8-3.9x faster than its former form on an H100) showed that an untuned GPU never
# reached it: without a table the defaults took the grouped GEMM's 16-row tiles (Qwen3-30B-A3B
# GPTQ-Int4 decode at batch 1: 4.343 ms/token, 4.89x its floor). Now the defaults take the
# GEMV where the tokens leave each expert half a row or less, and the tuner's GEMV grid has
# 1-8 warps with chunks sized per weight bytes (int4 chunks up to 32768 values).
# 1. Qwen3 int4 decode at batch 1 with the new defaults (no table on an H100), profiled:
#    int4 decode at 4.343 ms/token was no faster than bf16's 4.18 on an H100 in run_zzz30;
# 2. `loom bench moe --weight-dtype int4 --tune` at 1-8 tokens into a copy of the tables
#    ($R/cfg) (the defaults' own kernel timings and bf16 left for a later run: failed starts
#    spent the device time);
# 3. Qwen3 int4 decode at batch 1 with the tuned table. (bf16 experts on the new defaults
#    are left for a later run: failed starts spent the device time.)
source benchmarks/gpu/env.sh; R=$OUT/zzz114; mkdir -p $R/cfg
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
cp loom/kernels/configs/*.json $R/cfg/
L="--load-format dummy --num-iters-warmup 2 --num-iters 4 --input-len 128 --output-len 128 --batch-size 1"
q3() {  # q3 NAME MODEL DEADLINE [CONFIG_DIR [FLAGS]]
  LOOM_MOE_CONFIG_DIR=$4 timeout $(left $3) $LOOM bench latency --model $2 $L $5 \
    --output-json $R/q3-$1.json > $R/q3-$1.log 2>&1
  echo "q3-$1 rc $?: $(grep -E '^Decode|fused_moe' $R/q3-$1.log | cut -c1-170 | tr '\n' ' ')"
  stamp q3-$1
}
q3 int4-default qwen3-30b-a3b-gptq-int4 90 "" "--profile --profile-result-dir $R/prof"
grep -A36 "^Profile of one" $R/q3-int4-default.log | cut -c1-190; rm -rf $R/prof
B="1 2 4 8"
timeout $(left 200) $LOOM bench moe --weight-dtype int4 --tune --batch-sizes $B \
  --save-dir $R/cfg --output-json $R/tune-int4.json > $R/tune-int4.log 2>&1
echo "tune int4 rc $?"; grep -E "^(M=|compil|Wrote)" $R/tune-int4.log | cut -c1-200
stamp tune-int4
q3 int4-tuned qwen3-30b-a3b-gptq-int4 265 $R/cfg
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
