# 1 GPU (~7 min), session 55: issue 3's figures at HEAD, no -O (the H200's last such run was
# session 35's run_zzz82; GEMV tables and MoE tables moved since): 8B batch-1 decode
# 128 -> 128, prefill 8192 and 2048 (--output-len 1), then throughput 1000 x 1024 -> 256,
# each cut off at its deadline so that a short lease keeps what finished.
source benchmarks/gpu/env.sh; R=/tmp/zzz138; mkdir -p $R
L="--load-format dummy --num-iters-warmup 2 --batch-size 1"
lat decode llama-3.1-8b 150 --input-len 128 --output-len 128 --num-iters 5
lat prefill8192 llama-3.1-8b 260 --input-len 8192 --output-len 1 --num-iters 10
lat prefill2048 llama-3.1-8b 340 --input-len 2048 --output-len 1 --num-iters 10
pack decode.json prefill8192.json prefill2048.json decode.log
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 --step-breakdown"
timeout $(left 560) $LOOM bench throughput $T --output-json $R/thr-8b.json > $R/thr-8b.log 2>&1
echo "thr rc $?"; grep -E "torch.compile level|^(Throughput|Compute floor|  decode only|  with prompt|  steps)" $R/thr-8b.log | cut -c1-220
pack thr-8b.json thr-8b.log
stamp done
