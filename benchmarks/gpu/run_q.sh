# x2 (~3 min): is the TP=2 2048-token prefill's 33-vs-50 ms per-process split CPU placement?
# Prints the GPUs' NUMA nodes and local CPUs, then runs 2048 static "off" twice with every
# process pinned (taskset) to the CPUs local to GPU0 that this container may use.
source benchmarks/gpu/env.sh
R=/tmp/q; mkdir -p $R
{ nvidia-smi topo -m; lscpu | grep -iE "numa|socket|model name|^cpu\(s\)"
  python3 -c "import os; print('allowed', sorted(os.sched_getaffinity(0)))"; } > $R/topo.txt 2>&1
BUS=$(nvidia-smi -i 0 --query-gpu=pci.bus_id --format=csv,noheader | tr 'A-F' 'a-f' | cut -c5-)
D=/sys/bus/pci/devices/$BUS
echo "gpu0 $D numa=$(cat $D/numa_node) local=$(cat $D/local_cpulist)" >> $R/topo.txt
cat $R/topo.txt
CPUS=$(python3 -c "
import os
def parse(s):
    out=set()
    for part in s.strip().split(','):
        a,_,b=part.partition('-'); out.update(range(int(a), int(b or a)+1))
    return out
local=parse(open('$D/local_cpulist').read()); allowed=os.sched_getaffinity(0)
print(','.join(map(str, sorted(local & allowed))))")
echo "pin to: $CPUS (from $D)"
B="--model llama-3.1-8b --load-format dummy --no-enable-prefix-caching --max-model-len 9000 -tp 2 --output-len 1 --batch-size 1 --num-iters-warmup 5 --num-iters 15"
for i in 1 2; do
  LEFT=$(( 175 - ($(date +%s) - T0) )); [ $LEFT -lt 45 ] && break
  timeout $LEFT taskset -c $CPUS $LOOM bench latency $B --input-len 2048 -O '{"level":3,"compile_sizes":[2048],"cudagraph_capture_sizes":[]}' --output-json $R/pinned$i.json > $R/pinned$i.log 2>&1
  echo "pinned $i: $(grep -E '^Avg' $R/pinned$i.log)"
done
tar czf $OUT/q.tgz -C $R . ; stamp done
