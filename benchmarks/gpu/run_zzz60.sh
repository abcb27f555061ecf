# 1 GPU (~6 min warm), for a later session: what session 29 left unmeasured in the GEMV
# table. "try" = main's H200 table plus run_zzz57's winners it held back: qkv at 2 and 4
# rows, and down at 2..16 (now SiLU·mul kernel + the GEMV's tensor-core tiles, 69815c0);
# against main's table, alternated, 8B decode 128 -> 128 at -O 3, batch 4, 8 and 16.
source benchmarks/gpu/env.sh; R=$OUT/zzz60; mkdir -p $R/try
cp loom/kernels/configs/* $R/try/
python3 - $R/try <<'PY'
import json, sys
p = f"{sys.argv[1]}/gemv,dtype=bfloat16,device_name=NVIDIA_H200.json"
t = json.load(open(p))
dot = {"block_n": 64, "block_k": 256, "num_warps": 4, "num_stages": 4, "use_dot": True}
t["6144,4096"].update({"2": dot, "4": dot})
t["4096,14336"].update({m: dot for m in ("2", "4", "8", "16")})
json.dump(t, open(p, "w"), indent=1)
PY
L="--model llama-3.1-8b --load-format dummy --input-len 128 --output-len 128 --num-iters-warmup 2 --num-iters 4 -O 3"
for rep in 1 2; do
  for b in 16 8 4; do
    for t in try main; do
      [ $(left 560) -lt 40 ] && { echo "no time for $t b$b rep$rep"; continue; }
      if [ $t = try ]; then export LOOM_MOE_CONFIG_DIR=$R/try; else unset LOOM_MOE_CONFIG_DIR; fi
      timeout $(left 560) $LOOM bench latency $L --batch-size $b --output-json $R/lat-$t-b$b-$rep.json > $R/lat-$t-b$b-$rep.log 2>&1
      echo "$t b$b rep$rep rc $? $(grep -E '^Decode' $R/lat-$t-b$b-$rep.log | cut -c1-40)"; stamp $t b$b
    done
  done
done
unset LOOM_MOE_CONFIG_DIR
tar czf $OUT/zzz60.tgz -C $R .
