# 1 GPU (~2 min cold), session 26: would throughput's decode-only steps gain from two
# half-batches on two streams (one half's KV reads beside the other's GEMMs)?
source benchmarks/gpu/env.sh; R=$OUT/zzz38; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
timeout 300 python3 benchmarks/gpu/overlap_probe.py $R/overlap.json > $R/overlap.log 2>&1
echo "probe rc $?"; quiet < $R/overlap.log | cut -c1-200 | tail -14; stamp probe
tar czf $OUT/zzz38.tgz -C $R .
