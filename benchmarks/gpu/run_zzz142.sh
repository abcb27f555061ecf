# 1 GPU (~5.5 min), session 57. Throughput's slow steps (session 56: step #1, 16 fresh
# 1024-token prompts, ~2.2x the median prompt step in every 8B run since session 15; on the
# H100 #4 and #21 ~0.3 s over their neighbours): 8B throughput (1000 x 1024 -> 256, no -O)
# twice under --profile-steps, steps 1-6 then 19-23, each window read by step_trace.py (per
# step: host launch time, runtime calls, device time by kernel) and trace_gaps.py. The
# second run's step breakdown gives step #1 unprofiled.
source benchmarks/gpu/env.sh; R=/tmp/zzz142; mkdir -p $R
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 --step-breakdown"
prof() {  # prof NAME DEADLINE START COUNT
  local name=$1
  timeout $(left $2) $LOOM bench throughput $T --profile-steps $3 $4 --profile-result-dir $R/$name \
    --output-json $R/$name.json > $R/$name.log 2>&1
  echo "$name rc $?"; grep -E "torch.compile level|compiled while|^(Throughput|Compute floor|CUDA allocator|  decode only|  with prompt|    median|  the first)" $R/$name.log | cut -c1-220
  python3 benchmarks/gpu/step_trace.py $R/$name --top 20 > $R/$name-steps.txt 2>&1
  cut -c1-200 $R/$name-steps.txt
  python3 benchmarks/gpu/trace_gaps.py $R/$name --top 15 > $R/$name-gaps.txt 2>&1
  head -30 $R/$name-gaps.txt | cut -c1-200
  (cd $R && tar -czf $name-prof.tgz $name/*.txt $name/steps-rank0.json $name/trace-rank0.json \
    && [ $(stat -c %s $name-prof.tgz) -lt 6000000 ] || tar -czf $name-prof.tgz $name/*.txt)
  ls -la $R/$name-prof.tgz
  pack $name.json $name.log $name-steps.txt $name-gaps.txt $name-prof.tgz
  stamp $name
}
prof first 200 1 6
[ "${FIRST_ONLY:-0}" = 1 ] || prof later 320 19 5  # FIRST_ONLY=1: a short lease
# The slow prompt steps of every stored 8B run (H200: #21, #33, #36, #42 at ~2x the median,
# each beside a short one, so the with-prompt total stays ~count x median) read as host
# stalls; if the allocator counts retries above, a run on expandable segments says whether
# they are its cache flushes.
if [ "${FIRST_ONLY:-0}" != 1 ] && [ $(left 590) -gt 150 ]; then
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout $(left 590) $LOOM bench throughput $T \
    --output-json $R/expandable.json > $R/expandable.log 2>&1
  echo "expandable rc $?"; grep -E "^(Throughput|CUDA allocator|  decode only|  with prompt|    median)" \
    $R/expandable.log | cut -c1-220
  pack expandable.json expandable.log; stamp expandable
fi
