# 1 GPU (~8.5 min), session 48 (never run in session 47: failed starts spent its time).
# run_zzz113 (H100) measured the integer MoE GEMV 2.8-3.9x faster than its former form, and
# showed that an untuned GPU never reached it: without a table the defaults took the grouped
# GEMM's 16-row tiles (Qwen3-30B-A3B GPTQ-Int4 decode at batch 1: 4.343 ms/token, 4.89x its
# floor). Now the defaults take the GEMV where the tokens leave each expert half a row or
# less, and the tuner's GEMV grid has 1-8 warps with chunks sized per weight bytes.
# 1. Qwen3 int4 decode at batch 1 on the new defaults (no int4 table on any GPU), profiled;
# 2. Qwen3 bf16 decode at batch 1 (defaults on an H100, the shipped table on an H200);
# 3. `loom bench moe --weight-dtype int4` at 1-8 tokens on the defaults;
# 4. --tune int4 one batch size per call into a copy of the tables ($R/cfg), so that each
#    size finished is kept when the deadline cuts the rest;
# 5. Qwen3 int4 decode at batch 1 on the tuned table.
source benchmarks/gpu/env.sh; R=$OUT/zzz114; mkdir -p $R/cfg $R/none
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
cp loom/kernels/configs/*.json $R/cfg/
L="--load-format dummy --num-iters-warmup 2 --num-iters 4 --input-len 128 --output-len 128 --batch-size 1"
q3() {  # q3 NAME MODEL DEADLINE [CONFIG_DIR [FLAGS]]
  LOOM_MOE_CONFIG_DIR=$4 timeout $(left $3) $LOOM bench latency --model $2 $L $5 \
    --output-json $R/q3-$1.json > $R/q3-$1.log 2>&1
  echo "q3-$1 rc $?: $(grep -E '^Decode|fused_moe' $R/q3-$1.log | cut -c1-170 | tr '\n' ' ')"
  stamp q3-$1
}
q3 int4-default qwen3-30b-a3b-gptq-int4 100 "" "--profile --profile-result-dir $R/prof"
grep -A36 "^Profile of one" $R/q3-int4-default.log | cut -c1-190; rm -rf $R/prof
q3 bf16-default qwen3-30b-a3b 175
LOOM_MOE_CONFIG_DIR=$R/none timeout $(left 215) $LOOM bench moe --weight-dtype int4 \
  --batch-sizes 1 2 4 8 --output-json $R/moe-int4-default.json > $R/moe-int4-default.log 2>&1
echo "moe int4 default rc $?"; grep -E "^(M=|configs:)" $R/moe-int4-default.log | cut -c1-170
stamp moe-int4-default
for m in 1 2 4 8; do
  timeout $(left 440) $LOOM bench moe --weight-dtype int4 --tune --batch-sizes $m \
    --save-dir $R/cfg --output-json $R/tune-int4-$m.json > $R/tune-int4-$m.log 2>&1
  echo "tune int4 M=$m rc $?"; grep -E "^(M=|compil|Wrote)" $R/tune-int4-$m.log | cut -c1-200
  stamp tune-int4-$m
done
q3 int4-tuned qwen3-30b-a3b-gptq-int4 520 $R/cfg
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
