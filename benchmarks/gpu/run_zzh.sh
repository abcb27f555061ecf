# 1 GPU (~7 min), session 14. Tables for Qwen3-30B-A3B at TP=2, measured on one GPU with
# one rank's shapes (no 2-GPU host lent), so that a TP=2 run takes tuned tiles:
# 1. the fused MoE at N = 384 per rank (`loom bench moe -tp 2 --tune`), every batch size;
# 2. the decode GEMV at one rank's qkv, o_proj and LM head shards.
# Then the 8B prefill of 8192 tokens on this tree (standing: 0.2085-0.2157 s).
source benchmarks/gpu/env.sh
R=/tmp/zzh; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 200 $LOOM bench moe --model qwen3-30b-a3b -tp 2 --tune --save-dir $R/cfg --output-json $R/tune-tp2.json > $R/tune-tp2.log 2>&1
grep -E "^(M=|compiled|Wrote)|batch sizes in" $R/tune-tp2.log | cut -c1-200 | tail -20; stamp "moe tp2 tune"
GEMV="loom/kernels/configs/gemv,dtype=bfloat16,device_name=NVIDIA_H200.json"
timeout 130 python3 benchmarks/gpu/gemv_bench.py --output-json $R/gemv-q3tp2.json --shapes q3tp2_qkv,q3tp2_o,q3tp2_lm_head --jobs 12 --budget-s 80 --write-table "$GEMV" > $R/gemv-q3tp2.log 2>&1
grep -E "^ *(q3tp2|shape|wrote)" $R/gemv-q3tp2.log | cut -c1-170 | head -16; cp "$GEMV" $R/; stamp "gemv q3 tp2"
P="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 --input-len 8192 --output-len 1 --batch-size 1 --num-iters-warmup 3 --num-iters 10 -O 3"
timeout $(left 420) $LOOM bench latency $P --output-json $R/prefill8192.json > $R/prefill8192.log 2>&1
grep -E "^(Avg latency|Prefill|Ceilings)" $R/prefill8192.log | head -4; stamp "8b prefill 8192"
tar czf $OUT/zzh.tgz -C $R . ; stamp done
