# 1 GPU (~6 min), session 54, an H200 (an H100 does too). First sm_bandwidth_probe: what s
# SMs read of HBM, and a matmul beside them, the bound on an SM partition of a mixed step.
# Then: since 22aeaef int4 experts without their own table take the defaults, not the bf16
# table's tiles (an H100: throughput 1.24x faster, run_zzz134). The same on this card, whose
# int4 experts borrowed its bf16 table until then: Qwen3-30B-A3B GPTQ-Int4 throughput (300 x
# 1024 -> 256) and decode at batch 1, the tree (defaults) against the borrowing written out
# as an int4 table (a copy of the bf16 one).
source benchmarks/gpu/env.sh; R=/tmp/zzz135; mkdir -p $R/borrow
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
timeout 90 python3 benchmarks/gpu/sm_bandwidth_probe.py $R/sm-bw.json > $R/sm-bw.log 2>&1
echo "probe rc $?"; grep -v -E "^(INFO|DEBUG|\[W)" $R/sm-bw.log | tail -12; pack sm-bw.json sm-bw.log
stamp probe
cp loom/kernels/configs/*.json $R/borrow/
cp "loom/kernels/configs/E=128,N=768,dtype=bfloat16,device_name=$GPU.json" \
  "$R/borrow/E=128,N=768,dtype=int4_w4a16,device_name=$GPU.json" || exit 1
tp() {  # tp NAME DEADLINE: Qwen3 int4 throughput
  timeout $(left $2) $LOOM bench throughput --model qwen3-30b-a3b-gptq-int4 --load-format dummy \
    --input-len 1024 --output-len 256 --num-prompts 300 --output-json $R/$1.json > $R/$1.log 2>&1
  echo "$1 rc $?: $(grep -E '^Throughput' $R/$1.log | cut -c1-160)"; stamp $1
}
tp tp-defaults 180
LOOM_MOE_CONFIG_DIR=$R/borrow tp tp-borrow 300
pack tp-defaults.json tp-borrow.json tp-defaults.log
L="--load-format dummy --num-iters-warmup 2 --num-iters 4 --input-len 128 --output-len 128"
lat dec-defaults qwen3-30b-a3b-gptq-int4 370 --batch-size 1
LOOM_MOE_CONFIG_DIR=$R/borrow lat dec-borrow qwen3-30b-a3b-gptq-int4 430 --batch-size 1
pack dec-defaults.json dec-borrow.json
stamp done
