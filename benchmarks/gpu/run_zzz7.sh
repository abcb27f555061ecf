# 1 GPU (~8 min). run_zzz6: padding the 10 QPS prompt step (~565 tokens) to a piecewise
# graph of 576 took it from 33-37 ms to 23 ms. PIECEWISE_SIZES now go on past 512 (every
# 64 to 1024, every 128 to 2048), and the graphs of all sizes share their memory (weak
# aliases of the pool, one input slot per piece). Checks: the GPU tests (a wrong alias
# changes tokens), then A/B in one call: the new sizes against the old (--piece-sizes up
# to 512), interleaved, and the memory each size's capture reserved; then 1100-token
# prompts (sizes 1152, 1280) for their capture lines.
source benchmarks/gpu/env.sh
R=$OUT/zzz7; mkdir -p $R
P=$PWD/benchmarks/gpu/serve_steps_probe.py
timeout 150 python3 -m pytest -q -m gpu tests/compilation/test_piece_graph.py \
  "tests/compilation/test_level3.py::test_piecewise_graphs_on_gpu[1]" > $R/tests.log 2>&1
tail -3 $R/tests.log; stamp tests
probe() {  # name deadline [probe flags...]
  local name=$1 deadline=$2; shift 2
  timeout $(left $deadline) python3 $P --seconds 10 --no-async --json $R/$name.json "$@" > $R/$name.log 2>&1
  grep -E "piecewise CUDA graphs for" $R/$name.log | cut -c1-200
  grep -E '^\{' $R/$name.log | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('ttft_ms','prompt_steps','decode_steps')})"
  stamp "$name"
}
OLD=8,16,32,64,128,256,512
probe new-1 230
probe old-1 300 --piece-sizes $OLD
probe new-2 370
probe old-2 440 --piece-sizes $OLD
probe new-1100 520 --prompt-len 1100 --rate 5
tar czf $OUT/zzz7.tgz -C $R . ; stamp done
