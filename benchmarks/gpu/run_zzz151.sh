# 1 GPU (~8 min), session 60: the kernels' GPU-marked tests (190), not run whole since
# session 35's H200 (143 then). Small and shared-path files first, the two largest last;
# one line a test (-vv beside gpu_tests' -q) so that a cut run shows what passed.
source benchmarks/gpu/env.sh; R=/tmp/zzz151; mkdir -p $R
K=tests/kernels
gpu_tests kernels 480 -vv $K/test_paged_attention.py $K/test_kv_cache_fp8.py \
  $K/test_paged_attention_rope.py $K/test_packed_prefill.py $K/test_fused_moe.py \
  $K/test_fused_moe_fp8.py $K/test_collective_give_up.py $K/test_fast_launch.py \
  $K/test_compile_pool.py $K/test_all_reduce_norm_ll.py $K/test_pdl.py $K/test_jit_watch.py \
  $K/test_gemv_norm.py $K/test_rope_kv_write.py $K/test_attention_window.py
echo "$(grep -c PASSED $R/kernels.log) passed, $(grep -c -E 'FAILED|ERROR' $R/kernels.log) failed"
