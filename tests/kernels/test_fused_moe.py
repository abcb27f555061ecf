"""The Triton fused MoE against the plain-torch reference on random routings.

CPU: Triton's interpreter, fp32, tiny shapes with ragged tiles and idle experts.
CUDA (`-m gpu`): compiled, bf16, Qwen3-30B-A3B-sized experts.
"""

import os
import zlib

import torch

# Chosen before triton is imported; a CUDA host defaults to compiled kernels.
os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")

import pytest  # noqa: E402

triton = pytest.importorskip("triton")
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from loom.kernels import fused_moe as fused_moe_module  # noqa: E402
from loom.kernels import moe_gemm  # noqa: E402
from loom.kernels.fused_moe import fused_moe, moe_reference  # noqa: E402
from loom.kernels.moe_align import moe_align, moe_align_reference  # noqa: E402

# What the kernels were actually built as: another module may have imported them first.
INTERPRET = isinstance(moe_gemm._down_kernel, InterpretedFunction)
cpu_only = pytest.mark.skipif(not INTERPRET, reason="CPU checks need TRITON_INTERPRET=1")


@pytest.fixture(autouse=True)
def _seed(request):
    """Reproducible per test; each make_moe inside a test still draws fresh inputs."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def make_moe(tokens, hidden, inter, experts, top_k, *, used_experts=None,
             dtype=torch.float32, device="cpu"):
    """Weights scaled by 1/sqrt(fan_in) so activations stay O(1); routing is a top-k of
    random logits over `used_experts` (the rest receive no tokens)."""
    used = used_experts or experts
    x = torch.randn(tokens, hidden)
    w13 = torch.randn(experts, 2 * inter, hidden) / hidden ** 0.5
    w2 = torch.randn(experts, hidden, inter) / inter ** 0.5
    logits = torch.randn(tokens, used)
    weights, ids = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    ids = torch.randperm(experts)[:used][ids]  # scatter the used experts over the range
    cast = dict(device=device, dtype=dtype)
    return x.to(**cast), w13.to(**cast), w2.to(**cast), weights.to(device), ids.to(device)


def run_poisoned(monkeypatch, *args, **kwargs):
    """fused_moe with every scratch buffer it allocates pre-filled with NaN, so a row the
    kernels fail to write shows up in the result."""
    real_empty = torch.empty

    def nan_empty(*a, **kw):
        t = real_empty(*a, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    with monkeypatch.context() as m:
        m.setattr(fused_moe_module.torch, "empty", nan_empty)
        return fused_moe(*args, **kwargs)


@cpu_only
@pytest.mark.parametrize("block_m, tokens, top_k, experts",
                         [(16, 13, 3, 6), (32, 13, 3, 6), (16, 150, 4, 10), (16, 3, 2, 128)])
def test_moe_align(block_m, tokens, top_k, experts):
    # The third spans several of the kernels' 64-slot chunks; the last leaves most of its
    # 128 experts idle.
    ids = torch.randint(0, experts, (tokens, top_k))
    ids[:, 0] = 2  # one crowded expert; some others may stay idle
    sorted_ids, block_expert = moe_align(ids, experts, block_m)
    num_slots = ids.numel()
    assert sorted_ids.numel() == block_expert.numel() * block_m
    real = sorted_ids[sorted_ids < num_slots]
    assert sorted(real.tolist()) == list(range(num_slots)), "each slot exactly once"
    flat = ids.flatten()
    for b, e in enumerate(block_expert.tolist()):
        rows = sorted_ids[b * block_m:(b + 1) * block_m]
        rows = rows[rows < num_slots].long()
        if e < 0:
            assert rows.numel() == 0
        else:
            assert bool((flat[rows] == e).all()), "a row block holds one expert's slots"
    # Against the torch ops it replaced (a stable sort): the same runs and block owners;
    # within a run the kernel's order is arbitrary.
    ref_ids, ref_experts = moe_align_reference(ids, experts, block_m)
    assert torch.equal(block_expert, ref_experts)
    with pytest.MonkeyPatch.context() as m:  # the fallback takes the reference
        m.setenv("LOOM_MOE_ALIGN_TORCH", "1")
        assert torch.equal(moe_align(ids, experts, block_m)[0], ref_ids)
    assert torch.equal(sorted_ids < num_slots, ref_ids < num_slots), "the same padding places"
    for e in range(experts):
        rows = block_expert.repeat_interleave(block_m) == e
        assert torch.equal(sorted_ids[rows].sort().values, ref_ids[rows].sort().values)


# (tokens, hidden, inter, experts, top_k, used_experts, block_m, block_n, block_k)
CPU_CASES = {
    "decode-1tok": (1, 32, 32, 8, 2, None, 16, 16, 16),
    "ragged-tiles": (9, 48, 40, 4, 2, None, 16, 32, 32),
    "idle-experts": (21, 32, 48, 8, 4, 5, 16, 16, 32),
    "tall-blocks": (40, 32, 16, 4, 1, None, 32, 16, 16),
}


@cpu_only
@pytest.mark.parametrize("tma", [0, 1], ids=["pointers", "tma"])
@pytest.mark.parametrize("case", CPU_CASES.values(), ids=CPU_CASES.keys())
def test_fused_moe_cpu(case, tma, monkeypatch):
    """With TMA the weights (and down's activations) come through tensor descriptors: tiles
    past an expert's gate rows, past the K edge and over the NaN-poisoned padding rows of
    the intermediate buffer must all stay out of the result."""
    tokens, hidden, inter, experts, top_k, used, bm, bn, bk = case
    x, w13, w2, weights, ids = make_moe(tokens, hidden, inter, experts, top_k,
                                        used_experts=used)
    out = run_poisoned(monkeypatch, x, w13, w2, weights, ids,
                       block_m=bm, block_n=bn, block_k=bk, tma=tma)
    torch.testing.assert_close(out, moe_reference(x, w13, w2, weights, ids),
                               atol=1e-4, rtol=1e-4)


# (tokens, hidden, inter, experts, top_k, block_n, block_k): K chunks that do not divide
# hidden or inter and row blocks past the last row, a block of one row, several tokens
GEMV_CASES = {
    "decode-1tok": (1, 64, 48, 8, 4, 16, 32),
    "ragged": (3, 40, 24, 6, 2, 16, 32),
    "one-row-blocks": (2, 32, 16, 4, 2, 1, 16),
    "shared-experts": (9, 32, 32, 3, 3, 8, 64),
}


@cpu_only
@pytest.mark.parametrize("case", GEMV_CASES.values(), ids=GEMV_CASES.keys())
def test_fused_moe_gemv_cpu(case, monkeypatch):
    tokens, hidden, inter, experts, top_k, bn, bk = case
    x, w13, w2, weights, ids = make_moe(tokens, hidden, inter, experts, top_k)
    out = run_poisoned(monkeypatch, x, w13, w2, weights, ids, gemv=1, block_n=bn, block_k=bk)
    torch.testing.assert_close(out, moe_reference(x, w13, w2, weights, ids),
                               atol=1e-4, rtol=1e-4)


@cpu_only
def test_tma_on_strided_weights_falls_back_to_pointer_loads(monkeypatch, caplog):
    """A descriptor needs contiguous rows: w13 as a transposed view cannot have one, so the
    kernels take pointer loads, say so once, and still compute the right thing."""
    x, w13, w2, weights, ids = make_moe(9, 32, 16, 4, 2)
    w13_strided = w13.transpose(1, 2).contiguous().transpose(1, 2)  # same values, strided
    moe_gemm._say_no_tma.cache_clear()
    with caplog.at_level("INFO", logger="loom.kernels.moe_gemm"):
        out = run_poisoned(monkeypatch, x, w13_strided, w2, weights, ids, tma=1)
    torch.testing.assert_close(out, moe_reference(x, w13, w2, weights, ids),
                               atol=1e-4, rtol=1e-4)
    assert "pointer loads instead" in caplog.text


@cpu_only
def test_fused_moe_default_tiles(monkeypatch):
    x, w13, w2, weights, ids = make_moe(5, 64, 64, 4, 2)
    out = run_poisoned(monkeypatch, x, w13, w2, weights, ids)
    torch.testing.assert_close(out, moe_reference(x, w13, w2, weights, ids),
                               atol=1e-4, rtol=1e-4)


@cpu_only
def test_moe_reference_matches_dense_loop():
    """The reference itself, against the most literal per-token formula."""
    x, w13, w2, weights, ids = make_moe(3, 16, 8, 4, 2)
    want = torch.zeros_like(x)
    for t in range(3):
        for k in range(2):
            gate, up = (w13[ids[t, k]] @ x[t]).chunk(2)
            want[t] += weights[t, k] * (w2[ids[t, k]] @ (torch.nn.functional.silu(gate) * up))
    torch.testing.assert_close(moe_reference(x, w13, w2, weights, ids), want)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(),
                    reason="needs CUDA and compiled Triton")
@pytest.mark.parametrize("tokens", [1, 7, 64, 2048])
@pytest.mark.parametrize("experts,top_k,hidden,inter", [(128, 8, 2048, 768), (8, 2, 1024, 512)])
@pytest.mark.parametrize("config", [None, {"GEMV": 1, "BLOCK_N": 8, "BLOCK_K": 512},
                                    {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "TMA": 1,
                                     "num_warps": 8}],
                         ids=["tuned", "gemv", "tma"])
def test_fused_moe_gpu_bf16(tokens, experts, top_k, hidden, inter, config, monkeypatch):
    x, w13, w2, weights, ids = make_moe(tokens, hidden, inter, experts, top_k,
                                        dtype=torch.bfloat16, device="cuda")
    out = run_poisoned(monkeypatch, x, w13, w2, weights, ids, config=config)
    ref = moe_reference(x, w13, w2, weights, ids)
    torch.testing.assert_close(out.float(), ref.float(), atol=3e-2, rtol=3e-2)


_ALIGN_OFFLINE_COMPILE = r"""
import os
os.environ["TRITON_INTERPRET"] = "0"
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as tcompile
from loom.kernels.moe_align import _align_count_kernel, _align_place_kernel
pointers = {"ids_ptr": "*i64", "counts_ptr": "*i32", "rank_ptr": "*i32",
            "sorted_ids_ptr": "*i32", "block_expert_ptr": "*i32",
            "num_slots": "i32", "num_blocks": "i32"}
for fn, cons in [(_align_count_kernel, dict(CHUNK=64)),
                 (_align_place_kernel, dict(NUM_EXPERTS=128, EXPERTS_PAD=128, BLOCK_M=16,
                                            CHUNK=64))]:
    names = list(fn.arg_names)
    sig = {n: pointers.get(n, "constexpr") for n in names}
    src = ASTSource(fn=fn, signature=sig,
                    constexprs={(names.index(k),): v for k, v in cons.items()})
    kernel = tcompile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    assert kernel.asm["cubin"]
    print("ok")
"""


_GEMV_OFFLINE_COMPILE = r"""
import os
os.environ["TRITON_INTERPRET"] = "0"
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as tcompile
from loom.kernels.moe_gemv import _down_gemv_kernel, _gate_up_gemv_kernel
pointers = {"x_ptr": "*bf16", "w13_ptr": "*bf16", "inter_ptr": "*bf16", "w2_ptr": "*bf16",
            "out_ptr": "*bf16", "ids_ptr": "*i64", "topk_weights_ptr": "*fp32",
            "s_ptr": "*fp32", "z_ptr": "*u8", "stride_we": "i32", "stride_se": "i32",
            "stride_sn": "i32", "stride_sk": "i32", "exponent": "i32"}
for fn in (_gate_up_gemv_kernel, _down_gemv_kernel):
    # Qwen3-30B-A3B's experts; a chunk wider than the intermediate size (one masked pass)
    for block_n, block_k, stages in ((8, 512, 3), (4, 1024, 2)):
        cons = dict(TOP_K=8, HIDDEN=2048, INTER=768, BLOCK_N=block_n, BLOCK_K=block_k,
                    NUM_STAGES=stages, QUANT=0, GROUP_N=1, GROUP_K=1, K_PARTS=1, HAS_ZERO=0,
                    CONV=0)
        names = list(fn.arg_names)
        sig = {n: "constexpr" if n in cons else pointers[n] for n in names}
        src = ASTSource(fn=fn, signature=sig,
                        constexprs={(names.index(k),): v for k, v in cons.items()},
                        attrs={(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                               if sig[n] != "constexpr"})
        kernel = tcompile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
        assert kernel.asm["cubin"] and kernel.metadata.shared <= 227 * 1024
        print("ok")
"""


_GROUPED_OFFLINE_COMPILE = r"""
import os
os.environ["TRITON_INTERPRET"] = "0"
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as tcompile
from loom.kernels.moe_gemm import _down_kernel, _gate_up_kernel
BM, BN, BK = 128, 128, 64  # the H200 table's tiles from 2048 tokens up
for tma in (0, 1):
    desc = lambda rows: f"tensordesc<bf16[{rows}, {BK}]>" if tma else "*bf16"
    pointers = {"x_ptr": "*bf16", "w13_ptr": desc(BN), "w2_ptr": desc(BN),
                "out_ptr": "*bf16", "sorted_ids_ptr": "*i32", "block_expert_ptr": "*i32",
                "topk_weights_ptr": "*fp32", "s_ptr": "*fp32", "z_ptr": "*u8"}
    for fn in (_gate_up_kernel, _down_kernel):
        # gate_up writes the intermediate buffer through a pointer; down reads it
        inter = "*bf16" if fn is _gate_up_kernel else desc(BM)
        cons = dict(TOP_K=8, HIDDEN=2048, INTER=768, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
                    GROUP_M=8, PRECISION="tf32", TMA=tma, QUANT=0, GROUP_N=1, GROUP_K=1,
                    HAS_ZERO=0)
        names = list(fn.arg_names)
        sig = {n: "constexpr" if n in cons else "i32" if n.startswith(("num_", "stride_"))
               else inter if n == "inter_ptr" else pointers[n] for n in names}
        src = ASTSource(fn=fn, signature=sig,
                        constexprs={(names.index(k),): v for k, v in cons.items() if k in names},
                        # as at run time: pointers and strides divisible by 16
                        attrs={(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                               if sig[n].startswith("*") or n.startswith("stride_")})
        kernel = tcompile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=8, num_stages=3))
        assert kernel.asm["cubin"] and kernel.metadata.shared <= 227 * 1024
        ptx = kernel.asm["ptx"]
        # TMA: the descriptor loads are bulk tensor copies, and nothing spills
        assert ("cp.async.bulk.tensor" in ptx) == bool(tma), (fn.__name__, tma)
        print("ok", fn.__name__, tma, kernel.metadata.shared)
"""


def test_grouped_gemm_kernels_compile_for_sm90_offline():
    """The grouped GEMM at the H200 table's prompt-size tiles, with pointer loads and with
    TMA descriptors: both build for Hopper within its shared memory, and the TMA form's
    loads are bulk tensor copies."""
    from tests.triton_interpreter import compile_for_sm90_offline
    assert compile_for_sm90_offline(_GROUPED_OFFLINE_COMPILE).count("ok") == 4


def test_gemv_kernels_compile_for_sm90_offline():
    from tests.triton_interpreter import compile_for_sm90_offline
    assert compile_for_sm90_offline(_GEMV_OFFLINE_COMPILE).count("ok") == 4


def test_align_kernels_compile_for_sm90_offline():
    """tl.gather and the atomics, which only the interpreter runs here, build for Hopper."""
    from tests.triton_interpreter import compile_for_sm90_offline
    assert compile_for_sm90_offline(_ALIGN_OFFLINE_COMPILE).count("ok") == 2
