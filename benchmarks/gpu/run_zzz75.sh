# 1 GPU (~6 min), session 33: run_zzz74 again without its tests, now that bench latency
# captures the prompt step's size under FULL (run_zzz74 had no mixed graph), plus decode
# 128 -> 128 each way. From run_zzz74: cudagraph_mode FULL takes prefills and mixed batches of up to
# the largest decode capture size into whole-forward CUDA graphs (fixed-shape metadata, one
# packed attention launch). GPU tests: the fixed-shape attention in bf16 against the torch
# reference; the tiny llama and qwen3_moe under FULL (level 3 and 0) against the CPU, every
# prompt step through a mixed graph. Then 8B, alternated: the 128-token prompt step alone
# (--output-len 1) and a 4 x 128 prompt step, default against -O FULL.
source benchmarks/gpu/env.sh; R=$OUT/zzz75; mkdir -p $R
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 3 --num-iters 10 --output-len 1"
run() {  # mode (default|full), name, flags...
  local mode=$1 name=$2; shift 2
  [ $(left 545) -lt 40 ] && { echo "no time for $mode $name"; return; }
  local o=(); [ $mode = full ] && o=(-O '{"cudagraph_mode": "FULL"}')
  timeout $(left 558) $LOOM bench latency $L "$@" "${o[@]}" --output-json $R/$name-$mode.json > $R/$name-$mode.log 2>&1
  echo "$mode $name rc $? $(grep -E '^Avg|captured|FULL' $R/$name-$mode.log | cut -c1-150 | tr '\n' ' ')"
}
i=0; for m in default full full default default full; do i=$((i+1)); run $m p128-$i --input-len 128 --batch-size 1; done
stamp p128
i=0; for m in full default; do i=$((i+1)); run $m b4-$i --input-len 128 --batch-size 4; done
stamp b4
i=0; for m in default full; do i=$((i+1)); run $m d128-$i --input-len 128 --output-len 128 --batch-size 1 --num-iters 5; done
stamp decode
tar czf $OUT/zzz75.tgz -C $R .
