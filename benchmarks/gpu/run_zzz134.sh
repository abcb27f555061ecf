# 1 GPU (~6.5 min), session 54, an H100. run_zzz131 found (a) `--tune` at M=16384 ran out of
# memory in the finalists' captures (dead graphs' pools; KernelTimer now empties the cache
# before each capture) and (b) Qwen3 GPTQ-Int4 decode slower on the bf16 H100 table's GEMV
# tiles than on the defaults (3.028 against 2.941 ms/token). Here:
# 1. --tune at 16384 again, into the tree's bf16 table;
# 2. a candidate int4 H100 table (keys 1-8: the default GEMV config; 16 up: the bf16
#    table's tiles) against no H100 tables (int4 on the defaults everywhere): Qwen3 int4
#    decode, batch 1, and throughput 300 x 1024 -> 256.
source benchmarks/gpu/env.sh; R=/tmp/zzz134; mkdir -p $R/old $R/cand
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
[ "$GPU" = NVIDIA_H100_80GB_HBM3 ] || { echo "for an H100: its tables are the ones measured"; exit 1; }
MOE="loom/kernels/configs/E=128,N=768,dtype=bfloat16,device_name=$GPU.json"
cp loom/kernels/configs/*.json $R/old/; rm -f "$R/old/$(basename "$MOE")"
timeout 60 $LOOM bench moe --tune --batch-sizes 16384 --output-json $R/tune-16k.json \
  > $R/tune-16k.log 2>&1
echo "tune-16k rc $?"; grep -E "^(M=|Wrote|ceilings|loom bench)| M= " $R/tune-16k.log | cut -c1-300
cp "$MOE" $R/moe-table.json; pack moe-table.json tune-16k.json tune-16k.log; stamp tune
cp loom/kernels/configs/*.json $R/cand/
python3 - "$MOE" "$R/cand/E=128,N=768,dtype=int4_w4a16,device_name=$GPU.json" <<'PY'
import json, sys
import torch
from loom.kernels.moe_config import default_config
bf16 = json.load(open(sys.argv[1]))
table = {str(m): default_config(m, 8, 128, torch.bfloat16) for m in (1, 2, 4, 8)}
table.update({k: v for k, v in bf16.items() if int(k) >= 16})
json.dump(table, open(sys.argv[2], "w"), indent=1)
print("candidate int4 table:", json.dumps(table)[:400])
PY
cp "$R/cand/E=128,N=768,dtype=int4_w4a16,device_name=$GPU.json" $R/int4-table.json
pack int4-table.json
L="--load-format dummy --num-iters-warmup 2 --num-iters 4 --input-len 128 --output-len 128"
LOOM_MOE_CONFIG_DIR=$R/cand lat q3i4-cand qwen3-30b-a3b-gptq-int4 150 --batch-size 1
LOOM_MOE_CONFIG_DIR=$R/old lat q3i4-old qwen3-30b-a3b-gptq-int4 205 --batch-size 1
pack q3i4-cand.json q3i4-old.json
tp() {  # tp NAME DEADLINE: Qwen3 int4 throughput
  timeout $(left $2) $LOOM bench throughput --model qwen3-30b-a3b-gptq-int4 --load-format dummy \
    --input-len 1024 --output-len 256 --num-prompts 300 --output-json $R/$1.json > $R/$1.log 2>&1
  echo "$1 rc $?: $(grep -E '^Throughput' $R/$1.log | cut -c1-160)"; stamp $1
}
LOOM_MOE_CONFIG_DIR=$R/cand tp q3i4-tp-cand 320
LOOM_MOE_CONFIG_DIR=$R/old tp q3i4-tp-old 440
pack q3i4-tp-cand.json q3i4-tp-old.json q3i4-tp-cand.log
stamp done
