# 1 GPU (~1.5 min), session 56: issue 3's throughput run (8B, 1000 x 1024 -> 256, no -O)
# with its step breakdown, on the warm machine after run_zzz140.
source benchmarks/gpu/env.sh; R=/tmp/zzz141; mkdir -p $R
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 --step-breakdown"
timeout 225 $LOOM bench throughput $T --output-json $R/thr-8b.json > $R/thr-8b.log 2>&1
echo "thr rc $?"; grep -E "torch.compile level|^(Throughput|Compute floor|  decode only|  with prompt|  steps)" $R/thr-8b.log | cut -c1-220
pack thr-8b.json thr-8b.log
