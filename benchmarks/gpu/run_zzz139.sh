# 1 GPU (~4.5 min), session 55: run_zzz138 cut to fit a short lease. sm_bandwidth_probe with
# its TMA reader (how many SMs a reader with more bytes in flight needs to keep up with the
# copy), then 8B prefill 8192 and batch-1 decode 128 -> 128 at HEAD, no -O, on deadlines.
source benchmarks/gpu/env.sh; R=/tmp/zzz139; mkdir -p $R
timeout 100 python3 benchmarks/gpu/sm_bandwidth_probe.py $R/sm-bw.json > $R/sm-bw.log 2>&1
echo "sm-bw rc $?"; grep -v -E "^(INFO|DEBUG|\[W)" $R/sm-bw.log | tail -24; pack sm-bw.json sm-bw.log
stamp sm-bw
L="--load-format dummy --num-iters-warmup 2 --batch-size 1"
lat prefill8192 llama-3.1-8b 200 --input-len 8192 --output-len 1 --num-iters 10
pack prefill8192.json prefill8192.log
lat decode llama-3.1-8b 275 --input-len 128 --output-len 128 --num-iters 5
pack decode.json
stamp done
