# 1 GPU (~9 min), session 34: the GPU tests at HEAD (0843887's fits_one_launch routing and
# 6a54a0b's review were never run on a GPU), and whether Python's bytecode cache can live
# in /tmp on this host: run_zzz79's profile compiled 3811 sources in 7.9 s in a process
# that had run twice before (the image's site-packages hold no .pyc and take none).
source benchmarks/gpu/env.sh; R=$OUT/zzz80; mkdir -p $R
imp() { local s=$(date +%s%N); python3 -c "import torch._dynamo, torch._inductor.compile_fx, loom.cli"; echo "import $1: $(( ($(date +%s%N) - s) / 1000000 )) ms"; }
imp plain-1; imp plain-2
export PYTHONPYCACHEPREFIX=/tmp/pyc
imp prefix-1; imp prefix-2; imp prefix-3
stamp imports
timeout $(left 300) python3 -m pytest -q -m gpu tests --ignore=tests/e2e/test_gpu.py -p no:cacheprovider > $R/tests-kernels.log 2>&1
echo "kernel gpu tests rc $?"; grep -E "passed|failed|FAIL|Error" $R/tests-kernels.log | tail -8; stamp kernel-tests
timeout $(left 545) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider \
  -k "full or default or lone or bf16" > $R/tests-e2e.log 2>&1
echo "e2e gpu tests rc $?"; grep -E "passed|failed|FAIL|Error" $R/tests-e2e.log | tail -8; stamp e2e-tests
tar czf $OUT/zzz80.tgz -C $R .
