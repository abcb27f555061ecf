# 1 GPU (~2 min), session 59, for an H200 with little budget left: 8B decode 128 -> 128 and
# prefill 8192 at HEAD, no -O (the H200's last such figures are session 35's run_zzz82).
source benchmarks/gpu/env.sh; R=/tmp/zzz147; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader
L="--load-format dummy --num-iters-warmup 2 --batch-size 1"
lat decode llama-3.1-8b 100 --input-len 128 --output-len 128 --num-iters 5
pack decode.json
lat prefill8192 llama-3.1-8b 175 --input-len 8192 --output-len 1 --num-iters 10
pack prefill8192.json decode.log; stamp done
