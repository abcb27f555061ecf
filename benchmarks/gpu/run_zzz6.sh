# 1 GPU (~5 min). run_zzz5: a 10 QPS prompt step (550-token prompt beside ~14 decodes,
# ~565 tokens) takes 13.5-13.8 ms of kernel time on both trees but 17-50 ms of wall clock:
# at 565 tokens no piecewise CUDA graph applies (they stop at 512), so the pieces run
# eagerly and the host takes 0.7-1.5 ms a layer against the GPU's ~0.43 ms. Does a piece
# size of 576 (and 640) make that step GPU-bound? Interleaved A/B/A/B in one call.
source benchmarks/gpu/env.sh
R=$OUT/zzz6; mkdir -p $R
P=$PWD/benchmarks/gpu/serve_steps_probe.py
probe() {  # name deadline [probe flags...]
  local name=$1 deadline=$2; shift 2
  LOOM_LAYER_TIMES=1 timeout $(left $deadline) python3 $P --seconds 12 --no-async --json $R/$name.json "$@" > $R/$name.log 2>&1
  grep -E "piecewise CUDA graphs" $R/$name.log | cut -c1-200
  grep -E '^\{' $R/$name.log | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('ttft_ms','prompt_steps','decode_steps')})"
  grep -E "layer times: 5[5-9][0-9] tokens" $R/$name.log | awk '{h=h" "$9; g=g" "$12} END{print "host/layer:" h; print "GPU/layer:" g}' | cut -c1-400
  stamp "$name"
}
probe default-1 110
probe pieces640-1 200 --piece-sizes 8,16,32,64,128,256,512,576,640
probe default-2 285
probe pieces640-2 370 --piece-sizes 8,16,32,64,128,256,512,576,640
tar czf $OUT/zzz6.tgz -C $R . ; stamp done
