# 1 GPU (~3 min, the session's last 270 s), session 13. The MoE's GEMV kernels at 1-8
# tokens, each alone, over a wider grid than the tuner's: at one token gate_up ran at 76%
# and down at 58% of the copy rate sharing one config (run_zza's profile). Would a config
# per kernel pay, and how much?
source benchmarks/gpu/env.sh
R=/tmp/zzd; mkdir -p $R
timeout 200 python3 benchmarks/gpu/moe_probe.py --rows 1 2 4 8 --gemv-grid --json $R/moe-probe-gemv.json > $R/moe-probe-gemv.log 2>&1
grep -v "^  skipped" $R/moe-probe-gemv.log | cut -c1-200
tar czf $OUT/zzd.tgz -C $R . ; stamp done
