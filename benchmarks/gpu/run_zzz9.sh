# 1 GPU (~2.5 min, the session's last device time). The piecewise graphs of every padded
# size are now captured at start-up (run_zzz8: captured as they came, the first five
# requests of the sweep waited 0.18-0.38 s). The GPU tests, then one in-process 10 QPS
# probe: the start-up line (sizes, seconds, GB) and the first prompt steps.
source benchmarks/gpu/env.sh
R=$OUT/zzz9; mkdir -p $R
timeout 100 python3 -m pytest -q -m gpu tests/compilation/test_piece_graph.py \
  "tests/compilation/test_level3.py::test_piecewise_graphs_on_gpu[1]" > $R/tests.log 2>&1
tail -2 $R/tests.log; grep -E "^E |Error" $R/tests.log | head -5; stamp tests
timeout 110 python3 benchmarks/gpu/serve_steps_probe.py --seconds 8 --no-async --json $R/probe.json > $R/probe.log 2>&1
grep -E "piecewise CUDA graphs|warm-up:|torch.compile level|captured" $R/probe.log | cut -c1-220
grep -E '^\{|prompt steps' $R/probe.log | cut -c1-600; stamp probe
tar czf $OUT/zzz9.tgz -C $R . ; stamp done
