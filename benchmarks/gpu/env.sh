# Sourced by benchmarks/gpu/run_*.sh on a GPU host (see ../shared/device/README.md for the
# wheels in .whl/). Export LOOM_GIT_COMMIT (the host has no .git) before running a script.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LOOM_GIT_COMMIT=${LOOM_GIT_COMMIT:?}
LOOM="python3 -m loom.cli"
T0=$(date +%s)
stamp() { echo "=== $(( $(date +%s) - T0 ))s: $*"; }
left() { echo $(( $1 - ($(date +%s) - T0) )); }  # seconds left until $1 s after the start
quiet() { grep -v -E "^(INFO|DEBUG)|it/s\]|s/it\]" ; }
# lat NAME MODEL DEADLINE [FLAGS...]: `loom bench latency` with the script's $L flags, its JSON
# and log in $R, cut off DEADLINE s after the start; prints its summary lines.
lat() {
  local name=$1 model=$2 deadline=$3; shift 3
  timeout $(left $deadline) $LOOM bench latency --model $model $L "$@" \
    --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $?: $(grep -E '^(Avg|Decode|Speculative)' $R/$name.log | cut -c1-160 | tr '\n' ' ')"
  stamp $name
}
# pack FILE...: files of $R (progress bars dropped) appended to $OUT/<$R's name>.tar, one run
# at a time: at most 8 files come back from a call, and a cut-off call keeps what it packed.
pack() {
  for f in "$@"; do  # text only: run_zzz142's grep emptied its .tgz files
    case $f in *.tgz|*.gz|*.tar|*.pt) continue;; esac
    grep -v -E "it/s\]|s/it\]" $R/$f > $R/$f.tmp 2>/dev/null && mv $R/$f.tmp $R/$f
  done
  tar -rf $OUT/$(basename $R).tar -C $R "$@" 2>/dev/null
}
# gpu_tests NAME DEADLINE PYTEST-ARGS...: the GPU-marked tests, their log in $R/NAME.log
# (packed), cut off DEADLINE s after the start; prints the summary and the failures.
gpu_tests() {
  local name=$1 deadline=$2; shift 2
  [ $(left $deadline) -gt 20 ] || { echo "$name: no time left"; return; }
  timeout $(left $deadline) python3 -m pytest -q -m gpu -p no:cacheprovider "$@" > $R/$name.log 2>&1
  echo "$name rc $?: $(tail -1 $R/$name.log | cut -c1-160)"
  grep -E "^(FAILED|ERROR|E )" $R/$name.log | head -12 | cut -c1-220
  pack $name.log; stamp $name
}
