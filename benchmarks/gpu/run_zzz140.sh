# 1 GPU (~1 min), session 56: run on the warm machine right after run_zzz139, to use the
# lease's last minutes. 8B prefill 2048 and prefill 8192 again (run_zzz139's second sample)
# at HEAD, no -O.
source benchmarks/gpu/env.sh; R=/tmp/zzz140; mkdir -p $R
L="--load-format dummy --num-iters-warmup 2 --batch-size 1"
lat prefill2048 llama-3.1-8b 110 --input-len 2048 --output-len 1 --num-iters 10
lat prefill8192b llama-3.1-8b 230 --input-len 8192 --output-len 1 --num-iters 10
pack prefill2048.json prefill8192b.json prefill2048.log
