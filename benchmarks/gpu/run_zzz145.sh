# 1 GPU (~7 min), session 59. 8B throughput 1000 x 1024 -> 256 with each step timed by
# CUDA events (401ac64): do the 2x/0x step pairs of run_zzz142 go away, and what is each
# class of step against its floor on the device's own clock? Decode and prefill 8192 first.
source benchmarks/gpu/env.sh; R=/tmp/zzz145; mkdir -p $R
L="--load-format dummy --num-iters-warmup 2 --batch-size 1"
lat decode llama-3.1-8b 110 --input-len 128 --output-len 128 --num-iters 5
lat prefill8192 llama-3.1-8b 200 --input-len 8192 --output-len 1 --num-iters 10
pack decode.json prefill8192.json decode.log
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 --step-breakdown"
timeout $(left 420) $LOOM bench throughput $T --output-json $R/thr-8b.json > $R/thr-8b.log 2>&1
echo "thr rc $?"; grep -E "torch.compile level|^(Throughput|Compute floor|Step breakdown|  decode only|  with prompt|    |  steps)" $R/thr-8b.log | cut -c1-220
pack thr-8b.json thr-8b.log
stamp done
