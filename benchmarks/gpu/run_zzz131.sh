# 1 GPU (~6.5 min), session 53. run_zzz130 tuned the H100's fused-MoE table for Qwen3-30B-A3B
# at 1-8192 tokens (its 2048-16384 chunk failed at 16384 and, before the fix, took the chunk
# with it: 2048-8192 came from its log's checked rows) and its decode GEMV table at 2-16 rows (kernels alone 1.06x-1.20x cuBLAS at 8
# and 16). In the tree now; the tables before, via LOOM_MOE_CONFIG_DIR=$R/old.
# 1. --tune at 16384 alone into the tree's table (or why it fails);
# 2. Qwen3 throughput, 300 x 1024 -> 256, new tables against old (the MoE's prompt sizes);
# 3. Qwen3 GPTQ-Int4 decode, batch 1, new against old (int4 borrows the bf16 table).
# (8B on the new GEMV rows: run_zzz132.)
source benchmarks/gpu/env.sh; R=/tmp/zzz131; mkdir -p $R/old
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
[ "$GPU" = NVIDIA_H100_80GB_HBM3 ] || { echo "for an H100: its tables are the ones measured"; exit 1; }
MOE="loom/kernels/configs/E=128,N=768,dtype=bfloat16,device_name=$GPU.json"
cp loom/kernels/configs/*.json $R/old/; rm -f "$R/old/$(basename "$MOE")"
cp benchmarks/results/h100-session53-zzz130-7b13756/gemv-table-before.json \
  "$R/old/gemv,dtype=bfloat16,device_name=$GPU.json"
tune() {  # tune NAME DEADLINE SIZES...
  local name=$1 deadline=$2; shift 2
  timeout $(left $deadline) $LOOM bench moe --tune --batch-sizes "$@" \
    --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $?"; grep -E "^(M=|Wrote|ceilings|loom bench)" $R/$name.log | cut -c1-200; stamp $name
}
tune tune-16k 40 16384
cp "$MOE" $R/moe-table.json; pack moe-table.json tune-16k.json tune-16k.log
tp() {  # tp NAME DEADLINE: Qwen3 throughput
  timeout $(left $2) $LOOM bench throughput --model qwen3-30b-a3b --load-format dummy \
    --input-len 1024 --output-len 256 --num-prompts 300 --output-json $R/$1.json > $R/$1.log 2>&1
  echo "$1 rc $?: $(grep -E '^Throughput' $R/$1.log | cut -c1-160)"; stamp $1
}
tp q3-tp-new 150
LOOM_MOE_CONFIG_DIR=$R/old tp q3-tp-old 265
pack q3-tp-new.json q3-tp-old.json q3-tp-new.log
# Qwen3 GPTQ-Int4 has no H100 int4 table, so its experts now take the bf16 table's tiles where
# they took the defaults (run_zzz114: 2.953 ms/token on the defaults; an int4 table tuned
# alone was 1.05x slower end to end). Decode at batch 1, new against old.
L="--load-format dummy --num-iters-warmup 2 --num-iters 4 --input-len 128 --output-len 128"
lat q3i4-new qwen3-30b-a3b-gptq-int4 320 --batch-size 1
LOOM_MOE_CONFIG_DIR=$R/old lat q3i4-old qwen3-30b-a3b-gptq-int4 375 --batch-size 1
pack q3i4-new.json q3i4-old.json
stamp done
