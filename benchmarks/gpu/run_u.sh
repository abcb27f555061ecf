# x2 (~8.5 min), after run_t: the GPU tests it failed on, fixed (the TP=1 log line is
# captured in-process; p2p ops inside a decode graph's capture take PyTorch's capturable
# ops), then issue 5's 2048 rows, static and dynamic, with the default impl (now p2p) and
# every run's base -O cudagraph_mode FULL_AND_PIECEWISE, as run_t's 8192 row.
source benchmarks/gpu/env.sh
R=/tmp/u; mkdir -p $R
T="python3 -m pytest -q -p no:cacheprovider -rfE --tb=short -m gpu"
timeout -s INT 130 $T "tests/compilation/test_level3.py::test_piecewise_graphs_on_gpu[1]" "tests/compilation/test_tp2_passes.py::test_collective_matmuls_on_gpu[p2p]" > $R/tests.log 2>&1; echo "rc=$?" >> $R/tests.log
grep -E "^(FAILED|ERROR|E  )|passed|failed|rc=" $R/tests.log | tail -20
stamp tests
E="--load-format dummy --no-enable-prefix-caching --max-model-len 9000"
LEFT=$(( 560 - ($(date +%s) - T0) ))
LOOM_LAYER_TIMES=1 timeout $LEFT $LOOM bench async-tp --model llama-3.1-8b -tp 2 --input-lens 2048 --graphs static,dynamic --repeats 2 -O '{"cudagraph_mode":"FULL_AND_PIECEWISE"}' --result-dir $R/s2048 -- $E > $R/s2048.log 2>&1
grep -E "tokens, (static|dynamic)" $R/s2048.log
for f in $R/s2048/*.log; do echo "$(basename $f): $(grep -E '^Avg' $f) $(grep 'layer times: 2048' $f | tail -1 | sed 's/.*layer times//' | cut -c1-150)"; done
tar czf $OUT/u.tgz -C $R . ; stamp done
