# 1 GPU (~5 min), session 19: run_zzz12 again, A/B/A, after its split16 server stalled 1.8 s
# on a prefill variant compiled mid-serve (7f552f3 warms it up).
RUN=zzz13 bash benchmarks/gpu/run_zzz12.sh split16 split1 split16-again
