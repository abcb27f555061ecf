# 1 GPU: the 2 QPS point of the serving sweep, both frontend modes one after the other on the same GPU (run_b.sh ran them side by side on two GPUs)
source benchmarks/gpu/env.sh
R=$OUT/g; mkdir -p $R
timeout 230 $LOOM bench sweep --model llama-3.1-8b --rates 2 --modes multiprocess,inprocess --duration 40 --ignore-eos --dataset-name random --random-input-len 550 --random-output-len 150 --result-dir $R -- --load-format dummy --max-model-len 2048 -O '{"level":3}' 2>&1 | grep -v -E "^(INFO|DEBUG)|it/s\]|s/it\]" | tail -6; stamp done
