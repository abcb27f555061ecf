# 1 GPU (~9 min), session 13. Qwen3-30B-A3B throughput: 44.71 s in run_zza against 40.01 s
# at 80f69a9 (session 10, another H200): a regression in the code or the machines? Both
# trees in one call, the current first. Needs session 10's loom/ unpacked beside the tree:
#   git archive 80f69a9 loom | tar -x -C old80
# Before them, the routing kernel's GPU tests and Qwen3's float32 greedy tokens on GPU
# against the CPU.
source benchmarks/gpu/env.sh
R=/tmp/zzb; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 90 python3 -m pytest -q -m gpu tests/kernels/test_moe_route.py tests/e2e/test_gpu.py -k "route or qwen3" > $R/tests.log 2>&1; tail -2 $R/tests.log; stamp tests
T="--model qwen3-30b-a3b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
timeout 215 $LOOM bench throughput $T --output-json $R/qwen3-thr.json > $R/qwen3-thr.log 2>&1
grep -E "^(Throughput|Compute floor:|Ceilings)|^  (decode only|with prompt)" $R/qwen3-thr.log | cut -c1-200; stamp "current tree"
# from inside old80/: `python -m` puts the working directory first on sys.path
[ -d old80/loom ] && (cd old80 && LOOM_GIT_COMMIT=80f69a9 PYTHONPATH=/tmp/site:$PWD timeout $(left 570) $LOOM bench throughput $T --output-json $R/qwen3-thr-80f69a9.json > $R/qwen3-thr-80f69a9.log 2>&1)
grep -E "^(Throughput|Compute floor:|Ceilings)|^  (decode only|with prompt)" $R/qwen3-thr-80f69a9.log | cut -c1-200
tar czf $OUT/zzb.tgz -C $R . ; stamp done
