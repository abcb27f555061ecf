# 1 GPU (~6 min), session 64. Custom logits processors on CUDA (the GPU test), and their
# cost with nobody opting in: Llama-3.1-8B decode 128 -> 128 at batch 1 and 64, with and
# without a processor loaded (its machinery runs each step, and no request runs ahead of
# its sampled token). Then prefill 8192 at HEAD for issue 3.
source benchmarks/gpu/env.sh; R=/tmp/zzz158; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
gpu_tests gpu-lp 90 tests/e2e/test_gpu_logits_processors.py
L="--load-format dummy --num-iters-warmup 2 --input-len 128 --output-len 128 --num-iters 5"
P="--logits-processors tests.engine.logits_procs:TargetToken"
lat decode llama-3.1-8b 160 --batch-size 1
lat decode-lp llama-3.1-8b 220 --batch-size 1 $P
lat decode64 llama-3.1-8b 280 --batch-size 64
lat decode64-lp llama-3.1-8b 340 --batch-size 64 $P
pack gpu.txt decode.json decode-lp.json decode64.json decode64-lp.json decode-lp.log
L="--load-format dummy --num-iters-warmup 2 --batch-size 1"
lat prefill8192 llama-3.1-8b 430 --input-len 8192 --output-len 1 --num-iters 10
pack prefill8192.json prefill8192.log
stamp done
