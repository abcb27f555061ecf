# 1 GPU (~8 min), session 46: the int4 GEMV's steps over several groups (256-2048 values of
# a row a step, so each row is read in 128-1024 B runs), beside zzz110's best (64 rows x
# 128, 2 warps: qkv 16.8, o 15.0, gate_up 47.2, down 30.8 us on an H100, 0.19-0.43 of
# copy; session 45's GEMV 20.7 / 17.9 / 62.8 / 38.4). zzz110's grid was flat (gate_up
# 47-60 us over rows, warps, prmt or shift, prefetch), so neither the instructions
# (~3.8 a value: ~3 us of issue for qkv) nor the launch shape bound it; the next suspect
# is DRAM locality: 64 B of each of 64 rows 2 KB apart a step.
# 1. tests/kernels/test_int4_gemv.py on the GPU;
# 2. int4_tune.py --stages gemv (new grid) on 8B's projections, beside the old GEMV/tile;
# 3. 8B AWQ decode b1 and b2 end to end with the new defaults (one and two rows on the
#    GEMV; H100 b1 at ceb5b5b: 3.987 ms/token, 2.10x its floor).
source benchmarks/gpu/env.sh; R=$OUT/zzz111; mkdir -p $R
timeout $(left 60) python3 -m pytest -q tests/kernels/test_int4_gemv.py -k "not sm90" \
  -p no:cacheprovider > $R/kernels.log 2>&1
echo "kernel tests rc $? $(tail -1 $R/kernels.log)"; grep -E "^(FAILED|E  )" $R/kernels.log | head -12
stamp tests
timeout $(left 400) python3 benchmarks/gpu/int4_tune.py --stages gemv --budget-s $(left 340) \
  --out $R/int4-gemv.json 2>&1 | grep -v -E "^(INFO|DEBUG)" > $R/int4-gemv.log
echo "tune rc $?"; grep -E "^\S|\[gemv\]|\[old-gemv\]|\[tiled\]|bf16|budget" $R/int4-gemv.log \
  | grep -v -E "M=(5|8|12|16):" | awk '/\[gemv\].*M=1:/{c[$2]++; if (c[$2]>5) next} {print}' \
  | cut -c1-150
stamp tune
L="--load-format dummy --num-iters-warmup 2 --num-iters 4"
for b in 1 2; do
  [ $(left 560) -lt 50 ] && { echo "no time for b$b"; continue; }
  timeout $(left 580) $LOOM bench latency --model llama-3.1-8b-awq $L --input-len 128 \
    --output-len 128 --batch-size $b --output-json $R/b$b-awq.json > $R/b$b-awq.log 2>&1
  echo "b$b-awq rc $? $(grep -E '^Avg|^Decode' $R/b$b-awq.log | cut -c1-150 | tr '\n' ' ')"
done
stamp latency
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
