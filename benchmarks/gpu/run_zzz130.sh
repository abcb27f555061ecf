# 1 GPU (~8 min), session 53. Tables for the H100, the GPU this pool now lends: it had no
# fused-MoE table (Qwen3-30B-A3B ran the built-in defaults: decode 3.556 ms/token, 1.60x its
# floor, run_zzz129) and its decode GEMV table stops at 4 rows (the H200's holds 8B's
# shapes at 8 and 16 too, which batch 8-16 decodes and 5-row verify steps take).
# 1. `loom bench moe --tune` for Qwen3-30B-A3B at all 15 sizes, in three chunks (each
#    merges into the file, so a cut keeps the chunks done);
# 2. gemv_bench at 8 and 16 rows for 8B's shapes, and Qwen3's qkv / o / LM head at 2-16,
#    merged into the H100 table (null where cuBLAS wins);
# 3. end to end, the new tables against the tree's (LOOM_MOE_CONFIG_DIR=$R/old): Qwen3 decode
#    batch 1, 128 -> 128 (8B at batch 8 left to run_zzz131: the first try of this call was
#    taken back mid-run and cost half the session's device time).
source benchmarks/gpu/env.sh; R=/tmp/zzz130; mkdir -p $R/old; cp loom/kernels/configs/*.json $R/old/
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
MOE="loom/kernels/configs/E=128,N=768,dtype=bfloat16,device_name=$GPU.json"
GEMV="loom/kernels/configs/gemv,dtype=bfloat16,device_name=$GPU.json"
tune() {  # tune NAME DEADLINE SIZES...
  local name=$1 deadline=$2; shift 2
  timeout $(left $deadline) $LOOM bench moe --tune --batch-sizes "$@" \
    --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $?"; grep -E "^(M=|Wrote|ceilings)" $R/$name.log | cut -c1-170; stamp $name
}
tune tune-small 100 1 2 4 8 16 32
tune tune-mid 160 64 128 256 512 1024
tune tune-large 230 2048 4096 8192 16384
cp "$MOE" $R/moe-table.json; pack moe-table.json tune-small.log tune-mid.log tune-large.log
timeout $(left 390) python3 benchmarks/gpu/gemv_bench.py --jobs 14 --budget-s 130 \
  --shapes qkv1,o1,down1,lm_head1,q3_qkv,q3_o,q3_lm_head --ms 2,4,8,16 \
  --output-json $R/gemv.json --write-table "$GEMV" > $R/gemv.log 2>&1
echo "gemv_bench rc $?"; quiet < $R/gemv.log | tail -32 | cut -c1-170; stamp gemv_bench
cp "$GEMV" $R/gemv-table.json; pack gemv-table.json gemv.log
L="--load-format dummy --num-iters-warmup 2 --num-iters 4 --input-len 128 --output-len 128"
lat q3-new qwen3-30b-a3b 445 --batch-size 1
LOOM_MOE_CONFIG_DIR=$R/old lat q3-old qwen3-30b-a3b 500 --batch-size 1
pack q3-new.json q3-old.json q3-new.log
stamp done
