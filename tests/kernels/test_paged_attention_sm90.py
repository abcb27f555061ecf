"""The paged-attention kernels' compiled path, which Triton's CPU interpreter never
exercises: each variant the backend launches builds for Hopper (sm_90) with Triton's bundled
ptxas, no GPU needed, within an H100/H200 block's shared memory."""

_OFFLINE_COMPILE = r"""
import itertools
import os
os.environ["TRITON_INTERPRET"] = "0"
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as tcompile
from loom.kernels.paged_attention import _prefill_kernel
from loom.kernels.paged_decode import _decode_split_kernel

FLOATS = {"scale_log2", "norm_eps", "cap_log2"}
POINTERS = {"q_ptr": "*bf16", "cache_ptr": "*bf16", "out_ptr": "*bf16", "part_m_ptr": "*fp32",
            "part_l_ptr": "*fp32", "part_acc_ptr": "*fp32", "block_table_ptr": "*i32",
            "query_start_ptr": "*i32", "seq_lens_ptr": "*i32", "k_ptr": "*bf16",
            "v_ptr": "*bf16", "positions_ptr": "*i64", "cos_sin_ptr": "*fp32",
            "slot_mapping_ptr": "*i64", "q_norm_ptr": "*bf16", "k_norm_ptr": "*bf16",
            "count_ptr": "*i32", "tile_start_ptr": "*i32"}
UNALIGNED = {"stride_bt", "num_splits", "num_heads", "window"}  # not specialised (or not x16)
# Compile-time flags the launchers always pass; a test variant may override them.
DEFAULTS = {"F16_DOT": False, "SAT": 0.0, "PDL": False, "QK_NORM": False, "SEARCH_STEPS": 0,
            "Q_TOKENS": 1}


def build(fn, cons, warps, indexed, stages=2, cache="*bf16"):
    names = list(fn.arg_names)
    cons = dict({k: v for k, v in DEFAULTS.items() if k in names}, **cons,
                HAS_REQ_INDEX=indexed)
    sig = {}
    for name in names:
        if name in cons:
            sig[name] = "constexpr"
        elif name == "req_index_ptr":
            sig[name] = "*i32" if indexed else "constexpr"
            if not indexed:
                cons[name] = None
        elif name == "tile_start_ptr":  # a packed grid's (SEARCH_STEPS > 0) only
            sig[name] = "*i32" if cons["SEARCH_STEPS"] else "constexpr"
            if not cons["SEARCH_STEPS"]:
                cons[name] = None
        else:
            sig[name] = dict(POINTERS, cache_ptr=cache).get(
                name, "fp32" if name in FLOATS else "i32")
    # What a launch specialises on: 16-byte aligned pointers, strides that are multiples of 16.
    aligned = [i for i, n in enumerate(names)
               if sig[n] not in ("constexpr", "fp32") and n not in UNALIGNED]
    src = ASTSource(fn=fn, signature=sig,
                    constexprs={(names.index(k),): v for k, v in cons.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    kernel = tcompile(src, target=GPUTarget("cuda", 90, 32),
                      options=dict(num_warps=warps, num_stages=stages))
    assert kernel.asm["cubin"], "no cubin"
    # An H100/H200 block may opt into 227 KiB of shared memory.
    assert kernel.metadata.shared <= 227 * 1024, (fn.__name__, cons, kernel.metadata.shared)
    loads = kernel.asm["ptx"].count("ld.global")
    name = fn.__name__ + ("_direct" if cons.get("DIRECT") else "") \
        + ("_rope" if cons.get("ROPE") else "") + ("_qknorm" if cons.get("QK_NORM") else "") \
        + (f"_n{cons['BLOCK_N']}s{stages}"
                                                   if "BLOCK_N" in cons else "") \
        + (f"_p{cons['SPLITS_PAD']}" if cons.get("SPLITS_PAD", 1) > 1 else "") \
        + ("_fp8" if cache != "*bf16" else "") \
        + ("_packed" if cons.get("SEARCH_STEPS") else "") \
        + ("_window" if cons.get("WINDOW") else "") + ("_softcap" if cons.get("SOFTCAP") else "") \
        + (f"_q{cons['Q_TOKENS']}" if cons.get("Q_TOKENS", 1) > 1 else "")
    print("ok", name, cons["HEAD_DIM"], indexed, loads)


for indexed in (False, True):
    # the backend's bf16 prefill tiles: head dim 128 (128 rows x 64 keys, 4 warps, 3
    # stages) and 256 (64 x 32, 4 warps, 2 stages), GQA group 4 (Llama-3.1-8B)
    for head_dim, block_m, block_n, warps, stages in [(128, 128, 64, 4, 3),
                                                      (256, 64, 32, 4, 2)]:
        build(_prefill_kernel, dict(GROUP=4, GROUP_PAD=4, HEAD_DIM=head_dim, BLOCK_SIZE=16,
                                    BLOCK_Q=block_m // 4, BLOCK_N=block_n, PRECISION="tf32",
                                    MASK_ALL=False),
              warps, indexed, stages)
    # one split stores the output itself, several merge in their last program (up to 8
    # splits here); ROPE rotates and caches the new tokens (pure decode steps only, so
    # never with a request index)
    for direct, rope in itertools.product((False, True), (False, True) if not indexed
                                          else (False,)):
        # the backend's decode tiles: 128 keys three deep (16-bit keys), 64 two deep (the
        # general rule: fp32, head dim 256, narrow batches over an 8-bit cache)
        for block_n, stages in ((64, 2), (128, 3)):
            build(_decode_split_kernel, dict(GROUP=4, GROUP_PAD=16, HEAD_DIM=128,
                                             BLOCK_SIZE=16, BLOCK_N=block_n, PRECISION="tf32",
                                             DIRECT=direct, ROPE=rope,
                                             SPLITS_PAD=1 if direct else 8), 4, indexed, stages)
# cudagraph_mode FULL's mixed graphs: one packed launch, its requests found by search
build(_prefill_kernel, dict(GROUP=4, GROUP_PAD=4, HEAD_DIM=128, BLOCK_SIZE=16, BLOCK_Q=32,
                            BLOCK_N=64, PRECISION="tf32", MASK_ALL=False, SEARCH_STEPS=9),
      4, False, 3)
# an 8-bit cache (--kv-cache-dtype fp8): fp16 dots, saturating stores of the new tokens
build(_prefill_kernel, dict(GROUP=4, GROUP_PAD=4, HEAD_DIM=128, BLOCK_SIZE=16, BLOCK_Q=32,
                            BLOCK_N=64, PRECISION="tf32", MASK_ALL=False, F16_DOT=True),
      4, False, 3, cache="*fp8e4nv")
# (narrow batches: 128 keys two deep on 4 warps)
build(_decode_split_kernel, dict(GROUP=4, GROUP_PAD=16, HEAD_DIM=128, BLOCK_SIZE=16,
                                 BLOCK_N=128, PRECISION="tf32", DIRECT=False, ROPE=True,
                                 SAT=448.0, F16_DOT=True, SPLITS_PAD=8), 4, False, 2,
      cache="*fp8e4nv")
# ...and its wide batches' tiles: 64 keys three deep on 2 warps, one split or up to 8
# (64 programs and more, split toward 1024 in at most WIDE_8BIT_MAX_SPLITS)
for direct, pad in ((True, 1), (False, 8)):
    build(_decode_split_kernel, dict(GROUP=4, GROUP_PAD=16, HEAD_DIM=128, BLOCK_SIZE=16,
                                     BLOCK_N=64, PRECISION="tf32", DIRECT=direct, ROPE=True,
                                     SAT=448.0, F16_DOT=True, SPLITS_PAD=pad), 2, False, 3,
          cache="*fp8e4nv")
# Qwen3's q/k norm before the rotation (Qwen3-30B-A3B: 32 query heads over 4 KV heads)
build(_decode_split_kernel, dict(GROUP=8, GROUP_PAD=16, HEAD_DIM=128, BLOCK_SIZE=16,
                                 BLOCK_N=64, PRECISION="tf32", DIRECT=False, ROPE=True,
                                 QK_NORM=True, SPLITS_PAD=32), 4, False, 2)
# Gemma 2 9B's local layers (16 query heads over 8 KV heads of 256 dims): a sliding window
# and softcapped scores, in a CUDA graph's packed prefill and a decode that rotates and
# caches its new token (the backend's tiles for head dim 256)
build(_prefill_kernel, dict(GROUP=2, GROUP_PAD=2, HEAD_DIM=256, BLOCK_SIZE=16, BLOCK_Q=32,
                            BLOCK_N=32, PRECISION="tf32", MASK_ALL=False, SEARCH_STEPS=9,
                            WINDOW=True, SOFTCAP=True), 4, False, 2)
build(_decode_split_kernel, dict(GROUP=2, GROUP_PAD=16, HEAD_DIM=256, BLOCK_SIZE=16,
                                 BLOCK_N=32, PRECISION="tf32", DIRECT=False, ROPE=True,
                                 SPLITS_PAD=8, WINDOW=True, SOFTCAP=True), 4, False, 2)
# a verify's queries of up to 8 tokens (rows: tokens x the GQA group), the backend's 4-warp
# tiles: 16-bit keys, with and without a request index (an eager mixed step's split); a group
# of 8 (Qwen3-30B-A3B: 64 rows) in one split; an 8-bit cache's narrow tiles
for indexed in (False, True):
    build(_decode_split_kernel, dict(GROUP=4, GROUP_PAD=32, HEAD_DIM=128, BLOCK_SIZE=16,
                                     BLOCK_N=128, PRECISION="tf32", DIRECT=False, ROPE=False,
                                     SPLITS_PAD=32, Q_TOKENS=8), 4, indexed, 3)
build(_decode_split_kernel, dict(GROUP=8, GROUP_PAD=64, HEAD_DIM=128, BLOCK_SIZE=16,
                                 BLOCK_N=128, PRECISION="tf32", DIRECT=True, ROPE=False,
                                 SPLITS_PAD=1, Q_TOKENS=8), 4, False, 3)
build(_decode_split_kernel, dict(GROUP=4, GROUP_PAD=32, HEAD_DIM=128, BLOCK_SIZE=16,
                                 BLOCK_N=128, PRECISION="tf32", DIRECT=False, ROPE=False,
                                 F16_DOT=True, SPLITS_PAD=8, Q_TOKENS=8), 4, False, 2,
      cache="*fp8e4nv")
# the widest merge: 32 splits of a group of 8 heads of 256 dims (the backend's 32-key tile)
build(_decode_split_kernel, dict(GROUP=8, GROUP_PAD=16, HEAD_DIM=256, BLOCK_SIZE=16,
                                 BLOCK_N=32, PRECISION="tf32", DIRECT=False, ROPE=False,
                                 SPLITS_PAD=32), 4, False, 2)
"""


def test_compiles_for_sm90_offline():
    """The compiled path, which the interpreter never exercises, builds for Hopper with
    Triton's bundled ptxas (no GPU needed), with the request index on and off; on, each
    kernel loads one more value (its request's index)."""
    from tests.triton_interpreter import compile_for_sm90_offline
    stdout = compile_for_sm90_offline(_OFFLINE_COMPILE)
    lines = [line.split() for line in stdout.splitlines() if line.startswith("ok")]
    assert len(lines) == 29
    loads = {(name, int(dim), flag == "True"): int(n) for _, name, dim, flag, n in lines}
    for name, dim, indexed in loads:
        if indexed:
            assert loads[(name, dim, True)] == loads[(name, dim, False)] + 1, loads
