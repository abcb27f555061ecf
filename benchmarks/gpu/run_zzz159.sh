# 1 GPU (~5 min), session 64: issue 3's throughput, 1000 x 1024 -> 256 with every step
# timed (run_zzz145's), at HEAD; the H200's last was session 35's.
source benchmarks/gpu/env.sh; R=/tmp/zzz159; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 --step-breakdown"
timeout $(left 560) $LOOM bench throughput $T --output-json $R/thr-8b.json > $R/thr-8b.log 2>&1
echo "thr rc $?"; grep -E "torch.compile level|^(Throughput|Compute floor|Step breakdown|  decode only|  with prompt|    |  steps)" $R/thr-8b.log | cut -c1-220
pack gpu.txt thr-8b.json thr-8b.log
stamp done
