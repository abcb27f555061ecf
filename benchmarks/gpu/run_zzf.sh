# 1 GPU (~8 min), session 14. run_zze: Qwen3's q/k norm in the rotary kernels and the
# router's GEMV routing its own batch took decode 3.154 -> 3.062 / 3.022 ms/token, but the
# one router launch (GEMV table tile, 8 warps) took 6.9 us against 2.8 + 2.4 for the pair.
# 1. router_probe.py: the one launch's tiles (1-4 warps) against the pair, at 1-8 tokens;
#    the winners into the router table (an M where none wins takes the pair).
# 2. Qwen3 decode with the table, without it (the pair: LOOM_MOE_CONFIG_DIR at a copy of
#    the configs without the router file), and with it again.
# The probe ran past its 240 s before M=8 and never wrote the table, so all three decode runs
# took the pair. It found the one launch 0.93x the pair at one token, 1.04x at two, 1.26x at
# four: router_topk was taken out again (its kernel and this probe are in 79ac674).
source benchmarks/gpu/env.sh
R=/tmp/zzf; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
TABLE="loom/kernels/configs/router_topk,dtype=bfloat16,device_name=NVIDIA_H200.json"
timeout 240 python3 benchmarks/gpu/router_probe.py --json $R/router-probe.json --write-table "$TABLE" > $R/router-probe.log 2>&1
grep -E "^(M=|wrote)" $R/router-probe.log | cut -c1-250; tail -3 $R/router-probe.log | grep -i error; cp "$TABLE" $R/ 2>/dev/null; stamp probe
timeout 60 python3 -m pytest -v tests/kernels/test_moe_route.py -k "gpu or offline" > $R/tests.log 2>&1; echo "tests: $(grep -c ' PASSED' $R/tests.log) passed, $(grep -cE ' FAILED|ERROR' $R/tests.log) failed"
mkdir -p $R/pair-configs && cp loom/kernels/configs/*.json $R/pair-configs/ && rm -f "$R/pair-configs/$(basename "$TABLE")"
D="--model qwen3-30b-a3b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 110 $LOOM bench latency $D --output-json $R/qwen3-decode.json > $R/qwen3-decode.log 2>&1
echo "one launch: $(grep -E '^Decode' $R/qwen3-decode.log | head -1)"; stamp "decode, table"
LOOM_MOE_CONFIG_DIR=$R/pair-configs timeout 110 $LOOM bench latency $D --output-json $R/qwen3-decode-pair.json > $R/qwen3-decode-pair.log 2>&1
echo "pair: $(grep -E '^Decode' $R/qwen3-decode-pair.log | head -1)"; stamp "decode, pair"
timeout $(left 540) $LOOM bench latency $D --output-json $R/qwen3-decode-again.json > $R/qwen3-decode-again.log 2>&1
echo "one launch again: $(grep -E '^Decode' $R/qwen3-decode-again.log | head -1)"; stamp "decode, table again"
tar czf $OUT/zzf.tgz -C $R . ; stamp done
