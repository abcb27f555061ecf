# 1 GPU (~3.5 min), session 63: run_zzz145's decode and prefill 8192 only (the device time
# left after a failed start did not cover its throughput run), at the session's HEAD.
source benchmarks/gpu/env.sh; R=/tmp/zzz157; mkdir -p $R
L="--load-format dummy --num-iters-warmup 2 --batch-size 1"
lat decode llama-3.1-8b 100 --input-len 128 --output-len 128 --num-iters 5
lat prefill8192 llama-3.1-8b 190 --input-len 8192 --output-len 1 --num-iters 10
pack decode.json prefill8192.json decode.log prefill8192.log
stamp done
