# 1 GPU (~2 min; the session's last 200 s of device time): the Triton moe_align on CUDA.
# The fused MoE GPU tests, the MoE call times (tuned table, no --tune), then Qwen3-30B-A3B
# decode batch 1 (6.67 ms/token at 3485478 with the eager align; 4.33 at 581d558 traced).
source benchmarks/gpu/env.sh
R=/tmp/y; mkdir -p $R
timeout -s INT 60 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short -m gpu tests/kernels/test_fused_moe.py > $R/tests.log 2>&1; echo "rc=$?" >> $R/tests.log
grep -E "^(FAILED|ERROR|E  )|passed|failed|rc=" $R/tests.log | tail -8
timeout 40 $LOOM bench moe --model qwen3-30b-a3b --batch-sizes 1 8 64 512 4096 16384 --output-json $R/moe.json > $R/moe.log 2>&1; grep -vE "^INFO" $R/moe.log | tail -9
timeout $(( 140 - ($(date +%s) - T0) )) $LOOM bench latency --model qwen3-30b-a3b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3 --output-json $R/qwen3-decode.json > $R/qwen3-decode.log 2>&1
grep -E "^(Decode|Prefill)" $R/qwen3-decode.log
tar czf $OUT/y.tgz -C $R . ; stamp done
