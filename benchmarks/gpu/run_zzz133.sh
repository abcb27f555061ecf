# 1 GPU (~1.5 min; ~6 min on an H100, which then runs run_zzz132 too), session 54.
# mixed_overlap_probe: a step's prompt GEMMs on one stream beside its decodes' chain (GEMMs +
# paged decode attention over 484 x 1152 tokens of KV) on another, against today's one merged
# chain; the bound on issue 3's one untried throughput lever.
source benchmarks/gpu/env.sh; R=/tmp/zzz133; mkdir -p $R
timeout 200 python3 benchmarks/gpu/mixed_overlap_probe.py $R/overlap.json > $R/overlap.log 2>&1
echo "probe rc $?"; grep -v -E "^(INFO|DEBUG|\[W)" $R/overlap.log | tail -40
pack overlap.json overlap.log; stamp probe
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))")
[ "$GPU" = NVIDIA_H100_80GB_HBM3 ] && bash benchmarks/gpu/run_zzz132.sh
stamp done
