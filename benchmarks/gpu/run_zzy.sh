# 1 GPU (~2 min a tree), prepared in session 16, not yet run. Bisects the serving regression
# since 07a738d (run_zzw: 10 QPS TTFT 40.5 ms there, 88.4 ms at 0bfffdb, one call). Before
# the call, on the CPU side, put each commit's tree under bisect/ (untracked, so it travels):
#   for c in SHA1 SHA2 ...; do mkdir -p bisect/$c && git archive $c loom | tar -x -C bisect/$c; done
# Each tree is served in turn, in the order of `ls bisect`; each sweep's JSON lands in $OUT
# as it ends, so a cut-short call still returns those done.
source benchmarks/gpu/env.sh
mkdir -p $OUT/zzy
for dir in bisect/*/; do
  sha=$(basename $dir)
  (cd $dir && timeout 170 $LOOM bench sweep --model llama-3.1-8b --rates 10 --modes multiprocess \
    --duration 30 --ignore-eos --dataset-name random --random-input-len 550 --random-output-len 150 \
    --result-dir $OUT/zzy/$sha -- --load-format dummy --max-model-len 2048 -O '{"level":3}' \
    > $OUT/zzy/$sha.log 2>&1)
  echo "$sha: $(grep -E '^ +10 \|' $OUT/zzy/$sha.log)"; stamp "$sha"
  rm -f $OUT/zzy/$sha/server-multiprocess.log
done
