"""Programmatic dependent launch (loom.kernels.pdl) in the decode kernels.

The interpreter never takes the PDL path, so the CPU checks what it compiles to for sm_90
(Triton's bundled ptxas, no GPU): each kernel's first act is the wait, before any load of
another kernel's output, and only then does it release its dependent; a GEMV asks its weight
into L2 before the wait. With CUDA, the GEMV and the decode attention give the same bits
with PDL on and off inside a CUDA graph, right after a kernel that writes their input."""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
pytest.importorskip("triton")

from loom.kernels import pdl  # noqa: E402
from loom.kernels.gemv import GemvConfig, prefetch_bytes  # noqa: E402

_OFFLINE_COMPILE = r"""
import os
os.environ["TRITON_INTERPRET"] = "0"
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as tcompile
from loom.kernels.all_reduce_norm import _all_reduce_add_rms_norm_kernel
from loom.kernels.gemv import _gemv_kernel, _split_k_reduce_kernel
from loom.kernels.paged_decode import _decode_split_kernel

POINTERS = {"x_ptr": "*bf16", "w_ptr": "*bf16", "ws_ptr": "*fp32", "y_ptr": "*bf16",
            "part_ptr": "*fp32",
            "count_ptr": "*i32", "res_ptr": "*bf16", "nw_ptr": "*bf16", "out_ptr": "*bf16",
            "res_out_ptr": "*bf16", "data_ptrs": "*i64", "flag_ptrs": "*i64",
            "q_ptr": "*bf16", "cache_ptr": "*bf16", "part_m_ptr": "*fp32",
            "part_l_ptr": "*fp32", "part_acc_ptr": "*fp32", "block_table_ptr": "*i32",
            "query_start_ptr": "*i32", "seq_lens_ptr": "*i32", "k_ptr": "*bf16",
            "v_ptr": "*bf16", "positions_ptr": "*i64", "cos_sin_ptr": "*fp32",
            "slot_mapping_ptr": "*i64", "q_norm_ptr": "*bf16", "k_norm_ptr": "*bf16"}
FLOATS = {"eps", "scale_log2", "norm_eps"}


def build(fn, cons, warps=4, stages=2):
    names = list(fn.arg_names)
    cons = dict(cons)
    sig = {}
    for name in names:
        if name in cons:
            sig[name] = "constexpr"
        elif name == "req_index_ptr":
            sig[name], cons[name] = "constexpr", None
        else:
            sig[name] = POINTERS.get(name, "fp32" if name in FLOATS else "i32")
    aligned = [i for i, n in enumerate(names) if sig[n].startswith("*")]
    src = ASTSource(fn=fn, signature=sig,
                    constexprs={(names.index(k),): v for k, v in cons.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    kernel = tcompile(src, target=GPUTarget("cuda", 90, 32),
                      options=dict(num_warps=warps, num_stages=stages, launch_pdl=True))
    assert kernel.asm["cubin"] and kernel.metadata.launch_pdl
    lines = [l.strip() for l in kernel.asm["ptx"].splitlines()]
    def first(text):
        return next((i for i, l in enumerate(lines) if text in l), None)
    wait, release = first("griddepcontrol.wait"), first("griddepcontrol.launch_dependents")
    load, prefetch = first("ld.global"), first("cp.async.bulk.prefetch.L2")
    assert wait is not None and release is not None, fn.__name__
    # the wait before any load, and the release after the wait
    assert wait < release and (load is None or wait < load), (fn.__name__, wait, release, load)
    print("ok", fn.__name__, "prefetch" if prefetch is not None and prefetch < wait else "-")


gemv = dict(M=1, K=4096, BLOCK_N=16, BLOCK_K=512, SPLIT_K=4, SPLIT_MODE=1, USE_DOT=False,
            SILU_MUL=False, EVEN_N=True, DOT_PRECISION="tf32", NUM_STAGES=3, PDL=True,
            ADD_NORM=False)
build(_gemv_kernel, dict(gemv, PREFETCH_BYTES=1024), stages=3)
build(_gemv_kernel, dict(gemv, SILU_MUL=True, SPLIT_MODE=0, SPLIT_K=1, PREFETCH_BYTES=0),
      stages=3)
build(_gemv_kernel, dict(gemv, ADD_NORM=True, SPLIT_MODE=0, SPLIT_K=1, PREFETCH_BYTES=0),
      stages=3)
build(_split_k_reduce_kernel, dict(SPLIT_K=4, BLOCK=1024, PDL=True))
for direct, rope in ((True, True), (False, False)):
    build(_decode_split_kernel, dict(GROUP=4, GROUP_PAD=16, HEAD_DIM=128, BLOCK_SIZE=16,
                                     BLOCK_N=64, PRECISION="tf32", HAS_REQ_INDEX=False,
                                     DIRECT=direct, ROPE=rope, SAT=0.0, F16_DOT=False,
                                     PDL=True, QK_NORM=False,
                                     SPLITS_PAD=1 if direct else 8, Q_TOKENS=1))
for push in (False, True):
    build(_all_reduce_add_rms_norm_kernel, dict(N=4096, BLOCK=4096, WORLD=2, MAX_ROWS=8,
                                                PUSH=push, SLOT=8 * 16384, PDL=True), warps=8)
"""


def test_kernels_wait_first_and_gemv_prefetches_for_sm90_offline():
    from tests.triton_interpreter import compile_for_sm90_offline
    out = compile_for_sm90_offline(_OFFLINE_COMPILE).splitlines()
    assert out == ["ok _gemv_kernel prefetch", "ok _gemv_kernel -", "ok _gemv_kernel -",
                   "ok _split_k_reduce_kernel -",
                   "ok _decode_split_kernel -", "ok _decode_split_kernel -",
                   "ok _all_reduce_add_rms_norm_kernel -",
                   "ok _all_reduce_add_rms_norm_kernel -"]


@pytest.mark.parametrize("cfg, block_k, n, k, budget, expected", [
    # 4096 x 4096 bf16 (32 MiB), split 4: slices of 1024 = 2 chunks of 512 (1 KiB each)
    (GemvConfig(block_k=512, split_k=4), 512, 4096, 4096, 64 << 20, 2 * 1024),  # all of it
    (GemvConfig(block_k=512, split_k=4), 512, 4096, 4096, 16 << 20, 1 * 1024),  # half
    (GemvConfig(block_k=512, split_k=4), 512, 4096, 4096, 1, 1 * 1024),  # at least a chunk
    (GemvConfig(block_k=512, split_k=4), 512, 4096, 4096, 0, 0),  # turned off
    (GemvConfig(block_k=256, split_k=1), 256, 1024, 1000, 64 << 20, 0),  # uneven K
    (GemvConfig(block_k=16, split_k=1), 16, 64, 20, 64 << 20, 0),  # a row not 16-byte aligned
])
def test_prefetch_bytes(cfg, block_k, n, k, budget, expected):
    assert prefetch_bytes(cfg, block_k, n, k, 2, budget) == expected


def test_enabled_only_on_cuda_with_loom_pdl_1(monkeypatch):
    monkeypatch.setenv("LOOM_PDL", "1")
    assert not pdl.enabled(torch.device("cpu"))
    if not torch.cuda.is_available():
        return
    assert pdl.enabled(torch.device("cuda")) == (torch.cuda.get_device_capability()[0] >= 9)
    monkeypatch.delenv("LOOM_PDL")
    assert not pdl.enabled(torch.device("cuda"))


@pytest.mark.gpu
def test_gemv_and_decode_same_with_and_without_pdl_in_a_cuda_graph(monkeypatch):
    """In a graph, each PDL kernel right after the kernel that writes its input (x * 1.5):
    a kernel that read before its wait would see the value from before the replay."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs an sm_90+ GPU")
    from loom.kernels.gemv import gemv
    from loom.kernels.paged_decode import paged_decode
    torch.manual_seed(0)
    dev = torch.device("cuda")
    heads, kv_heads, hd, block, ctx = 32, 8, 128, 16, 300
    w = torch.randn(4096, 4096, dtype=torch.bfloat16, device=dev) / 64
    cache = torch.randn(2, 64, block, kv_heads, hd, dtype=torch.bfloat16, device=dev)
    table = torch.randperm(64, device=dev, dtype=torch.int32)[None, :]
    qsl = torch.tensor([0, 1], dtype=torch.int32, device=dev)
    seq = torch.tensor([ctx], dtype=torch.int32, device=dev)
    x0 = torch.randn(1, 4096, dtype=torch.bfloat16, device=dev)
    q0 = torch.randn(1, heads, hd, dtype=torch.bfloat16, device=dev)
    results = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("LOOM_PDL", flag)
        src, q_src = torch.zeros_like(x0), torch.zeros_like(q0)
        x, q = torch.empty_like(x0), torch.empty_like(q0)
        outs = [torch.zeros_like(q0) for _ in range(2)]

        def step():
            torch.mul(src, 1.5, out=x)
            y = gemv(x, w, config=GemvConfig(block_n=16, block_k=512, split_k=4))
            torch.mul(q_src, 1.5, out=q)
            for out, splits in zip(outs, (1, 4)):
                paged_decode(q, cache, out, table, qsl, seq, 1, hd ** -0.5, splits)
            return y
        step()  # compiles, makes the split-K counters
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = step()
        src.copy_(x0)
        q_src.copy_(q0)
        graph.replay()
        torch.cuda.synchronize()
        results[flag] = [y.clone()] + [o.clone() for o in outs]
    torch.testing.assert_close(results["1"][0], (x0 * 1.5).float() @ w.float().T,
                               rtol=2e-2, atol=2e-2, check_dtype=False)
    for a, b in zip(results["0"], results["1"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
