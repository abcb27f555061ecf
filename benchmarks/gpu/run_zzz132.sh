# 1 GPU (~4.5 min), session 53. run_zzz130 added 8- and 16-row configs to the H100's decode
# GEMV table (kernels alone 1.06x-1.22x cuBLAS). End to end on one H100, the tables in the
# tree against the tables before (LOOM_MOE_CONFIG_DIR=$R/old), alternated: 8B decode at
# batch 8 (8 rows) and batch 16, and an n-gram verify step at batch 1 (5 rows: the 8-row
# key), 128 -> 128, with `loom bench latency`'s step line.
source benchmarks/gpu/env.sh; R=/tmp/zzz132; mkdir -p $R/old
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
[ "$GPU" = NVIDIA_H100_80GB_HBM3 ] || { echo "for an H100: its table is the one measured"; exit 1; }
cp loom/kernels/configs/*.json $R/old/
cp benchmarks/results/h100-session53-zzz130-7b13756/gemv-table-before.json \
  "$R/old/gemv,dtype=bfloat16,device_name=$GPU.json"
L="--load-format dummy --num-iters-warmup 2 --num-iters 4 --input-len 128 --output-len 128"
NG='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
step() { grep -E "a step, median" $R/$1.log | cut -c1-200; }
lat b8-new llama-3.1-8b 75 --batch-size 8
LOOM_MOE_CONFIG_DIR=$R/old lat b8-old llama-3.1-8b 115 --batch-size 8
lat b16-new llama-3.1-8b 155 --batch-size 16
LOOM_MOE_CONFIG_DIR=$R/old lat b16-old llama-3.1-8b 195 --batch-size 16
pack b8-new.json b8-old.json b16-new.json b16-old.json b8-new.log
lat ng-new llama-3.1-8b 235 --batch-size 1 --temperature 0 --speculative-config "$NG"; step ng-new
LOOM_MOE_CONFIG_DIR=$R/old lat ng-old llama-3.1-8b 275 --batch-size 1 --temperature 0 \
  --speculative-config "$NG"; step ng-old
pack ng-new.json ng-old.json
stamp done
