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
e2e() {  # name, pytest -k expression, seconds from the start to stop by
  timeout $(left $3) python3 -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider -k "$2" > $R/tests-$1.log 2>&1
  echo "$1 gpu tests rc $?"; grep -E "passed|failed|FAIL|Error" $R/tests-$1.log | tail -8; stamp $1
}
e2e full "full" 200
timeout $(left 420) python3 -m pytest -q -m gpu tests --ignore=tests/e2e/test_gpu.py -p no:cacheprovider > $R/tests-kernels.log 2>&1
echo "kernel gpu tests rc $?"; grep -E "passed|failed|FAIL|Error" $R/tests-kernels.log | tail -8; stamp kernel-tests
e2e rest "default or lone or bf16" 560
tar czf $OUT/zzz80.tgz -C $R .
