# 1 GPU (~6 min), prepared in session 18, not yet run. With the 10 QPS prompt step replaying
# piecewise graphs (445af8e: 17.2 ms median against 13.8 ms of kernels), the attention op
# is the host's main cost in a mixed step: a mixed-step split launches the decode kernel,
# its reduce and the prefill kernel (three launches a layer where one did). Does handing a
# few decodes to the prefill kernel (LOOM_MIXED_SPLIT_MIN_DECODES) cost GPU time or save
# host time now? A/B/A/B in one call, no async; then each with five prompt steps profiled
# (kernels' GPU time a step); LOOM_LAYER_TIMES on the first pair (host against GPU a layer).
# Each probe's start-up line also gives the piece graphs' memory captured largest first
# (c98274f; 1.16 GB + 0.50 GB smallest first in run_zzz9).
source benchmarks/gpu/env.sh
R=$OUT/zzz10; mkdir -p $R
P=$PWD/benchmarks/gpu/serve_steps_probe.py
probe() {  # name deadline [probe flags...]
  local name=$1 deadline=$2; shift 2
  timeout $(left $deadline) python3 $P --seconds 10 --no-async --json $R/$name.json "$@" > $R/$name.log 2>&1
  # start-up: c98274f's pieces largest first (memory?); the warm-up's phases (16 s at
  # fe61b90 against 4.5-5 s at 07a738d, run_zzz5); the decode graphs' capture (~14 s?)
  grep -E "the pieces captured at|for 64 tokens: |captured [0-9]+ CUDA graphs|torch.compile level" $R/$name.log | cut -c1-200
  grep -E "warm-up:" $R/$name.log | sed 's/.*the sampler in/warm-up: the sampler in/' 
  grep -E '^\{' $R/$name.log | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('ttft_ms','prompt_steps','decode_steps')})"
  grep -E "layer times: 5[5-9][0-9] tokens" $R/$name.log | python3 -c "
import re, statistics, sys
h = [float(m.group(1)) for m in (re.search(r'host ([\d.]+) ms', l) for l in sys.stdin) if m]
print(f'host/layer median {statistics.median(h):.3f} ms over {len(h)} steps') if h else None"
  grep -A12 "^profiled" $R/$name.log | head -13; stamp "$name"
}
NOSPLIT=1000000
LOOM_LAYER_TIMES=1 probe split-1 100
LOOM_LAYER_TIMES=1 LOOM_MIXED_SPLIT_MIN_DECODES=$NOSPLIT probe nosplit-1 180
probe split-2 260 --profile-prompt-steps 5
LOOM_MIXED_SPLIT_MIN_DECODES=$NOSPLIT probe nosplit-2 340 --profile-prompt-steps 5
tar czf $OUT/zzz10.tgz -C $R . ; stamp done
