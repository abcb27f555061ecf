# 1 GPU (~2.5 min), session 49: where the draft model's ~24 ms a step goes (run_zzz116, H100:
# Llama-3.2-1B drafting 4 for itself took 25.6 ms a step of 4.9 tokens against its 1.3 ms
# decode alone). One iteration under torch.profiler (device kernels) and one under cProfile
# (host functions).
source benchmarks/gpu/env.sh; R=$OUT/zzz117; mkdir -p $R/prof
D4='{"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4}'
timeout $(left 170) $LOOM bench latency --model llama-3.2-1b --load-format dummy \
  --num-iters-warmup 1 --num-iters 2 --input-len 128 --output-len 64 --batch-size 1 \
  --temperature 0 --speculative-config "$D4" --profile --profile-host \
  --profile-result-dir $R/prof > $R/self.log 2>&1
echo "rc $?"; grep -E "^(Decode|Speculative)" $R/self.log | cut -c1-160
grep -A40 "^Profile of one" $R/self.log | cut -c1-200
ls $R/prof | head
for f in $R/prof/*; do case $f in *.txt) head -60 $f | cut -c1-200;; esac; done
for f in $R/*.log; do grep -v -E "it/s\]|s/it\]" $f > $f.tmp; mv $f.tmp $f; done
