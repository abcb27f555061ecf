# 1 GPU (~5 min), session 19: run_zzz12 again, A/B/A, after its split16 server stalled 1.8 s
# on a prefill variant compiled mid-serve (7f552f3 warms it up). Served TTFT at 10 QPS (8B
# dummy, 550 -> 150; issue 7's goal <= 40 ms) with mixed steps in one attention launch below 16 decodes (eb77510; run_zzz10
# in-process: prompt step 17.7 / 17.5 against 23.1 / 23.2 ms median) against the former
# default (every mixed step split, LOOM_MIXED_SPLIT_MIN_DECODES=1). The sweep and flags of
# run_zzz8; the server inherits the environment.
source benchmarks/gpu/env.sh
R=$OUT/zzz13; mkdir -p $R
O='{"level":3,"cudagraph_capture_sizes":[1,2,4,8,16,24,32,40,48,56,64]}'
sweep() {  # name deadline [env...]
  local name=$1 deadline=$2; shift 2
  env "$@" timeout $(left $deadline) $LOOM bench sweep --model llama-3.1-8b --rates 10 \
    --modes multiprocess --duration 30 --ignore-eos --dataset-name random --random-input-len 550 \
    --random-output-len 150 --result-dir $R/$name \
    -- --load-format dummy --max-model-len 2048 -O "$O" > $R/$name.log 2>&1
  grep -E "server side|^ +10 \|" $R/$name.log; grep -h "compiled while serving" $R/$name/server-*.log | cut -c1-160; stamp "$name"
}
sweep split16 175
sweep split1 350 LOOM_MIXED_SPLIT_MIN_DECODES=1
sweep split16-again 525
find $R -name "server-multiprocess.log" -size +2M -delete
tar czf $OUT/zzz13.tgz -C $R . ; stamp done
