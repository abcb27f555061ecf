# 1 GPU (~8 min), session 35: issue 3's figures at HEAD, no -O: 8B throughput (1000 x 1024 ->
# 256; its mixed steps are where the shared staging ring of loom/pinned.py takes two uploads
# a step), then batch-1 decode 128 -> 128 and prefill 2048 / 8192 (--output-len 1).
source benchmarks/gpu/env.sh; R=$OUT/zzz82; mkdir -p $R
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 --step-breakdown"
timeout $(left 300) $LOOM bench throughput $T --output-json $R/thr-8b.json > $R/thr-8b.log 2>&1
echo "thr rc $?"; grep -E "torch.compile level|^(Throughput|Compute floor|  decode only|  with prompt|  steps)" $R/thr-8b.log | cut -c1-220; stamp thr
L="--model llama-3.1-8b --load-format dummy --num-iters-warmup 2 --batch-size 1"
run() {  # name, flags...
  local name=$1; shift
  [ $(left 560) -lt 50 ] && { echo "no time for $name"; return; }
  timeout $(left 570) $LOOM bench latency $L "$@" --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $? $(grep -E '^Avg|^Decode|^Prefill|ceiling' $R/$name.log | cut -c1-90 | tr '\n' ' ')"
}
run decode --input-len 128 --output-len 128 --num-iters 5
run prefill2048 --input-len 2048 --output-len 1 --num-iters 10
run prefill8192 --input-len 8192 --output-len 1 --num-iters 10
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz82.tgz -C $R .
