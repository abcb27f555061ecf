# 1 GPU (~9 min), prepared in session 33 and not yet run: serving with cudagraph_mode FULL
# (prefills and mixed batches of up to the largest decode capture size in whole-forward
# graphs) against the default, 8B, multiprocess frontend, one rate each, alternated. 10 QPS
# of 550 -> 150 tokens (the serving goal's shape: a ~576-token step of one prompt and ~10
# decodes: the default decode sizes stop at 512, so FULL's run lists sizes up to 1024 for
# its mixed graphs to hold that step; its decodes, ~10-15 a step, pad to 16 either way), then 10 QPS
# of 128 -> 128 (short prompts, where a step was 3x its weight floor under piece graphs).
source benchmarks/gpu/env.sh; R=$OUT/zzz78; mkdir -p $R
FULL='{"level": 3, "cudagraph_mode": "FULL", "cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]}'
DEF='{"level": 3}'
serve() {  # mode (default|full), name, input len, output len
  local mode=$1 name=$2 inp=$3 outp=$4 o=$DEF
  [ $(left 545) -lt 90 ] && { echo "no time for $mode $name"; return; }
  [ $mode = full ] && o=$FULL
  timeout $(left 558) $LOOM bench sweep --model llama-3.1-8b --rates 10 --modes multiprocess --duration 30 \
    --ignore-eos --dataset-name random --random-input-len $inp --random-output-len $outp \
    --result-dir $R/$name-$mode -- --load-format dummy --max-model-len 2048 -O "$o" 2>&1 | quiet > $R/$name-$mode.log
  echo "$mode $name: $(grep -E -i 'ttft|tpot' $R/$name-$mode.log | tail -2 | tr '\n' ' ' | cut -c1-200)"
}
serve default q550 550 150; serve full q550 550 150; serve full q128 128 128; serve default q128 128 128
stamp serve
tar czf $OUT/zzz78.tgz -C $R .
