# 1 GPU (~8 min cold), session 24.
# 1. attn_varlen_probe: throughput's prompt-step attention (16 fresh 1024-token prompts a
#    layer) in loom's varlen kernel against torch's varlen_attn and cuDNN's SDPA;
# 2. 8B throughput, 1000 x 1024 -> 256, at HEAD (the standing figure is eb77510's; prompt
#    steps now run loom's add + norm kernel past 8 rows), then with --kv-cache-dtype fp8.
source benchmarks/gpu/env.sh; R=$OUT/zzz34; mkdir -p $R
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))"); echo "GPU $GPU"
timeout 150 python3 benchmarks/gpu/attn_varlen_probe.py $R/attn-varlen.json > $R/attn-varlen.log 2>&1
echo "probe rc $?"; grep -v "^INFO\|Warning\|warn" $R/attn-varlen.log | cut -c1-200 | head -30; stamp probe
T="--model llama-3.1-8b --load-format dummy --input-len 1024 --output-len 256 --num-prompts 1000 --max-model-len 2048 -O 3 --step-breakdown"
for kv in auto fp8; do
  [ $(left 560) -lt 100 ] && { echo "no time for thr-$kv"; break; }
  timeout $(left 585) $LOOM bench throughput $T --kv-cache-dtype $kv --output-json $R/thr-8b-$kv.json > $R/thr-8b-$kv.log 2>&1
  echo "thr-$kv rc $?"; grep -E "^(Throughput|Compute floor|  decode only|  with prompt|  steps)" $R/thr-8b-$kv.log | cut -c1-220; stamp thr-$kv
done
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
tar czf $OUT/zzz34.tgz -C $R .
