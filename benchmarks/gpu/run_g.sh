# x2: the 2 QPS point of the serving sweep again, with the GPUs swapped against run_b.sh (multiprocess on GPU1, in-process on GPU0)
source benchmarks/gpu/env.sh
R=$OUT/g; mkdir -p $R
for MODE in multiprocess inprocess; do
 G=$([ $MODE = multiprocess ] && echo 1 || echo 0)
 ( CUDA_VISIBLE_DEVICES=$G timeout 170 $LOOM bench sweep --model llama-3.1-8b --rates 2 --modes $MODE --duration 60 --ignore-eos --dataset-name random --random-input-len 550 --random-output-len 150 --result-dir $R/$MODE -- --load-format dummy --max-model-len 2048 -O '{"level":3}' > $R/$MODE.log 2>&1 ) &
done
wait
for MODE in multiprocess inprocess; do grep -v -E "^(INFO|DEBUG)|it/s\]|s/it\]" $R/$MODE.log | tail -4; done; stamp done
