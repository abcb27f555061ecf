# 1 GPU (~8 min), session 55. First sm_bandwidth_probe with its TMA reader: how many SMs a
# reader with more bytes in flight needs to keep up with the copy (run_zzz137: plain loads
# read ~30 GB/s an SM, so attention on a few SMs starves and an SM partition cannot pay).
# Then issue 3's figures at HEAD, no -O (the H200's last such run was session 35's
# run_zzz82): 8B batch-1 decode 128 -> 128, prefill 8192 (--output-len 1), throughput
# 1000 x 1024 -> 256, each on a deadline so that a short lease keeps what finished. Since
# session 59 the throughput's steps are timed by CUDA events (no 2x/0x read-back pairs).
source benchmarks/gpu/env.sh; R=/tmp/zzz138; mkdir -p $R
timeout 100 python3 benchmarks/gpu/sm_bandwidth_probe.py $R/sm-bw.json > $R/sm-bw.log 2>&1
echo "sm-bw rc $?"; grep -v -E "^(INFO|DEBUG|\[W)" $R/sm-bw.log | tail -24; pack sm-bw.json sm-bw.log
stamp sm-bw
L="--load-format dummy --num-iters-warmup 2 --batch-size 1"
lat decode llama-3.1-8b 190 --input-len 128 --output-len 128 --num-iters 5
lat prefill8192 llama-3.1-8b 290 --input-len 8192 --output-len 1 --num-iters 10
pack decode.json prefill8192.json decode.log
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 --step-breakdown"
timeout $(left 500) $LOOM bench throughput $T --output-json $R/thr-8b.json > $R/thr-8b.log 2>&1
echo "thr rc $?"; grep -E "torch.compile level|^(Throughput|Compute floor|  decode only|  with prompt|  steps)" $R/thr-8b.log | cut -c1-220
pack thr-8b.json thr-8b.log
stamp done
