# x2 (~9.5 min), after run_r (419c946): its two piecewise GPU tests failed (24, their
# compile size, is also a decode capture size: a piece captured its own graph inside the
# decode graph's capture; fixed). Then issue 5's 8192 static row with the fairest "off":
# every run's base -O has cudagraph_mode FULL_AND_PIECEWISE (2048 TP=2 off: 41-45 ms ->
# 32.3 ms with it in run_r). Async TP on compiles one whole graph, not captured either way.
# loom's p2p ops against off, two repeats interleaved (run_r: p2p 118.7, symm_mem 119.6).
source benchmarks/gpu/env.sh
R=/tmp/t; mkdir -p $R
T="python3 -m pytest -q -p no:cacheprovider -rfE --tb=short -m gpu"
timeout -s INT 170 $T tests/compilation/test_level3.py -k piecewise > $R/tests-piecewise.log 2>&1; echo "rc=$?" >> $R/tests-piecewise.log
grep -E "^(FAILED|ERROR|E  )|passed|failed|rc=" $R/tests-piecewise.log | tail -25
stamp piecewise tests
timeout -s INT 110 $T tests/compilation/test_tp2_passes.py -k "on_gpu and p2p" > $R/tests-p2p.log 2>&1; echo "rc=$?" >> $R/tests-p2p.log
grep -E "^(FAILED|ERROR|E  )|passed|failed|rc=" $R/tests-p2p.log | tail -15
stamp p2p test
E="--load-format dummy --no-enable-prefix-caching --max-model-len 9000"
LEFT=$(( 568 - ($(date +%s) - T0) ))
LOOM_LAYER_TIMES=1 timeout $LEFT $LOOM bench async-tp --model llama-3.1-8b -tp 2 --input-lens 8192 --graphs static --impls p2p --repeats 2 -O '{"cudagraph_mode":"FULL_AND_PIECEWISE"}' --result-dir $R/s8192 -- $E > $R/s8192.log 2>&1
grep -E "tokens, static|^\|" $R/s8192.log
for f in $R/s8192/*.log; do echo "$(basename $f): $(grep -E '^Avg' $f) $(grep 'layer times: 8192' $f | tail -1 | sed 's/.*layer times//' | cut -c1-150)"; done
tar czf $OUT/t.tgz -C $R . ; stamp done
