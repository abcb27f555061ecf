# 1 GPU (~4 min), session 14's last call. The tree as it stands (Qwen3's q/k norm inside the
# rotary kernels; router_topk taken out again):
# 1. Qwen3-30B-A3B decode under the profiler: its kernels a step and a layer's sequence.
# 2. Llama-3.1-8B decode (4.308 ms/token at 051c884): the attention op's new arguments
#    leave the Llama path as it was.
source benchmarks/gpu/env.sh
R=/tmp/zzg; mkdir -p $R
D="--model qwen3-30b-a3b --load-format dummy --no-enable-prefix-caching --max-model-len 4096 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 140 $LOOM bench latency $D --profile --profile-result-dir $R/prof --output-json $R/qwen3-decode.json > $R/qwen3-decode.log 2>&1
echo "qwen3: $(grep -E '^Decode' $R/qwen3-decode.log | head -1)"
python3 benchmarks/gpu/decode_steps.py $R/prof --json $R/qwen3-decode-steps.json --sequence 100 > $R/qwen3-decode-steps.txt
head -30 $R/qwen3-decode-steps.txt | cut -c1-150; stamp "qwen3 decode"
D8="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 2048 --input-len 128 --output-len 128 --batch-size 1 --decode-split --num-iters-warmup 2 --num-iters 5 -O 3"
timeout 100 $LOOM bench latency $D8 --output-json $R/llama8b-decode.json > $R/llama8b-decode.log 2>&1
echo "8b: $(grep -E '^Decode' $R/llama8b-decode.log | head -1)"; stamp "8b decode"
find $R -name 'trace-*.json' -size +20M -delete
tar czf $OUT/zzg.tgz -C $R . ; stamp done
