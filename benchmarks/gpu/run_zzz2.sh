# 1 GPU (~7 min), session 17. run_zzz placed the 10 QPS TTFT regression in the engine
# (server split: prefill 57 ms of 73) and in the first half of the commits since 07a738d
# (a96a380 already 70 ms against 07a738d's 51 ms), while the same engine in-process (run_zzx)
# reached first tokens in 32.5 ms. Is the served engine's CPU the difference: the container's
# CPU quota (cgroup cpu.max) throttling the three processes, or torch's intra-op threads
# spinning beside the engine loop? The cgroup's throttle counters around each sweep, the
# busiest threads every 15 s, and the same sweep with OMP_NUM_THREADS=1.
source benchmarks/gpu/env.sh
R=$OUT/zzz2; mkdir -p $R
left() { echo $(( $1 - ($(date +%s) - T0) )); }
echo "cpu.max: $(cat /sys/fs/cgroup/cpu.max 2>&1)  nproc: $(nproc)  affinity: $(taskset -pc $$ 2>&1 | cut -d: -f2)"
O='{"level":3,"cudagraph_capture_sizes":[1,2,4,8,16,24,32,40,48,56,64]}'
cstat() { grep -E "usage_usec|nr_throttled|throttled_usec" /sys/fs/cgroup/cpu.stat | tr '\n' ' '; }
sweep() {  # name dir deadline [extra server flags...]
  local name=$1 dir=$2 deadline=$3; shift 3
  (for i in $(seq 1 12); do sleep 12; echo "--- $((i * 12)) s"; top -b -H -n 1 -w 160 | sed -n 7,22p; done > $R/$name-top.txt 2>&1) &
  local topper=$!
  echo "$name before: $(cstat)"
  (cd $dir && timeout $(left $deadline) $LOOM bench sweep --model llama-3.1-8b --rates 10 \
    --modes multiprocess --duration 30 --ignore-eos --dataset-name random --random-input-len 550 \
    --random-output-len 150 --result-dir $R/$name \
    -- --load-format dummy --max-model-len 2048 -O "$O" "$@" > $R/$name.log 2>&1)
  echo "$name after:  $(cstat)"
  kill $topper 2>/dev/null
  grep -E "server side|^ +10 \|" $R/$name.log
  grep -E "Median TTFT|P99 TTFT|P99 ITL" $R/$name.log | tr -s ' ' | tr '\n' ';'; echo; stamp "$name"
}
sweep head . 200
OMP_NUM_THREADS=1 sweep omp1 . 360
sweep old07 old07 560
tar czf $OUT/zzz2.tgz -C $R --exclude=server-multiprocess.log . ; stamp done
