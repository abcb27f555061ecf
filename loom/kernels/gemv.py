"""y = x @ W^T for a handful of rows (decode at batch 1..16): a bandwidth-bound GEMV.

At batch 1 a linear layer reads every byte of its weight once and does two flops per
weight, so its floor is the weight's size over the memory bandwidth. cuBLAS reaches 60-90 %
of the H200's copy rate at Llama-3.1-8B TP=2 shapes, and for some shapes adds a split-K
reduce kernel (about 1.7 us at decode). This kernel is the plain streaming alternative:

* program (n, s) owns BLOCK_N output rows and streams its [BLOCK_N, K / SPLIT_K] slab of W
  (an nn.Linear weight: [N, K], rows contiguous) along K in BLOCK_K chunks, 16-byte loads;
  K is a constexpr, so the loop bound is one too (the CPU interpreter needs that, and it
  lets the compiler pipeline the loop with `num_stages`);
* for each chunk, every one of the M (constexpr, 1..16) input rows is multiplied in float32
  (`use_dot=False`: FMAs and a row reduction) or all of them at once on the tensor cores,
  the rows padded to 16 (`use_dot=True`; the dot's operands go through shared memory,
  which the software pipeliner fills with asynchronous copies);
* SPLIT_K > 1 cuts K into slices for shapes whose N / BLOCK_N programs would leave SMs
  idle. Three ways to sum the slices (`split_mode`):
    "fixup":  each program stores its float32 partial, then bumps a per-row-block counter;
              the last one to arrive sums the partials in slice order (deterministic) and
              writes y, and resets the counter. One launch. The counters
              (`kernels/arrival.py`) are made by the first call on a device, which must
              not be inside a CUDA graph capture.
    "reduce": partials to a [SPLIT_K, M, N] float32 buffer, then a second tiny kernel sums
              and casts (two launches, deterministic; what cuBLAS does).
    "atomic": float32 atomic adds into a zeroed [M, N] buffer, then a cast (a memset and
              two launches; the order of the adds, hence the rounding, varies by run).
* `silu_mul_input=True`: x is [M, 2K] = [gate | up] and the input is silu(gate) * up,
  computed per chunk as torch's eager ops would (silu in float32 rounded to x's dtype, the
  product rounded again), so the down projection needs no separate SwiGLU kernel. Each
  program recomputes it for its slice, a few thousand exps against megabytes of weight.

Everything accumulates in float32; y has x's dtype. No host syncs: it can be captured in a
CUDA graph (after one eager call for the "fixup" counters, as for any Triton kernel's
compile). Which shapes take it at decode, and the ops compiled graphs call:
`kernels/gemv_decode.py`.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from loom import envs
from loom.kernels import arrival, pdl
from loom.kernels.compile_pool import launch_or_compile
from loom.kernels.gemv_config import (MAX_M, SPLIT_MODES, GemvConfig, _check_inputs,
                                      _resolve_config, default_config, prefetch_bytes)
from loom.kernels.host import cdiv, next_power_of_2
from loom.kernels.silu_mul import silu_mul_values

__all__ = ["MAX_M", "GemvConfig", "add_rms_norm_gemv", "default_config", "gemv",
           "prefetch_bytes"]


@triton.jit
def _add_norm_input(x, res, nw_ptr, cols, ok, elem: tl.constexpr):
    """h = x + residual at `cols` (rounded to elem, as the reference's add), and h times
    the norm weight: the product's input before the rows' 1 / RMS, which the GEMV applies
    to its sums once the whole row has been read. Both float32."""
    h = (x.to(tl.float32) + res.to(tl.float32)).to(elem).to(tl.float32)
    return h, h * tl.load(nw_ptr + cols, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, ws_ptr, y_ptr, part_ptr, count_ptr, res_ptr, nw_ptr, res_out_ptr, eps, N,
    M: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, SPLIT_MODE: tl.constexpr, USE_DOT: tl.constexpr,
    SILU_MUL: tl.constexpr, EVEN_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
    NUM_STAGES: tl.constexpr, PDL: tl.constexpr = False, PREFETCH_BYTES: tl.constexpr = 0,
    ADD_NORM: tl.constexpr = False, W_SCALE: tl.constexpr = False,
):
    # SPLIT_MODE: 0 no split (y directly), 1 "fixup", 2 "reduce", 3 "atomic".
    # ADD_NORM (SPLIT_K 1): the input is RMSNorm(x + residual) * norm weight. Each
    # program reads whole rows of x and residual, so it sums h = x + residual's squares as
    # it goes and scales its sums by the rows' 1 / RMS at the end (no pass over the rows
    # before the weight streams); programs of the first row block write h to res_out.
    # PDL: launched with programmatic dependent launch. The weight is no kernel's output,
    # so the first PREFETCH_BYTES of each of this program's rows (its slice of K) are asked
    # into L2 before waiting for the previous kernel; x and everything else after.
    # W_SCALE: W is fp8 or int8 with a float32 scale per row (ws_ptr), applied to the sums.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    # Rows padded to a power of two; a dot's operand to 16.
    M_POW2: tl.constexpr = 1 if M == 1 else (2 if M == 2 else (4 if M <= 4 else (
        8 if M <= 8 else 16)))
    M_PAD: tl.constexpr = 16 if USE_DOT else M_POW2
    K_SPLIT: tl.constexpr = (K + SPLIT_K * BLOCK_K - 1) // (SPLIT_K * BLOCK_K) * BLOCK_K
    K_ITERS: tl.constexpr = K_SPLIT // BLOCK_K
    EVEN_K: tl.constexpr = K_SPLIT * SPLIT_K == K
    X_STRIDE: tl.constexpr = 2 * K if SILU_MUL else K
    elem = x_ptr.dtype.element_ty

    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if EVEN_N:
        rows_ld = rows
    else:  # clamped, not masked: the loads stay unpredicated; only the store is masked
        rows_ld = tl.minimum(rows, N - 1)
    mcols = tl.arange(0, M_PAD)
    k0 = pid_k * K_SPLIT
    if PDL:
        if PREFETCH_BYTES > 0:
            pdl.prefetch_l2(w_ptr + rows_ld.to(tl.int64) * K + k0,
                            tl.full([BLOCK_N], PREFETCH_BYTES, tl.int32))
        pdl.wait_then_release()
    if ADD_NORM:
        tl.static_assert(SPLIT_K == 1, "ADD_NORM needs each program's rows whole")
        squares = tl.zeros([M_PAD], dtype=tl.float32)
    w_ptrs = w_ptr + rows_ld.to(tl.int64)[:, None] * K + (k0 + tl.arange(0, BLOCK_K))[None, :]
    acc = tl.zeros([BLOCK_N, M_PAD], dtype=tl.float32)
    for i in tl.range(0, K_ITERS, num_stages=NUM_STAGES):
        ks = k0 + i * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        if EVEN_K:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
        if USE_DOT:
            x_ptrs = x_ptr + mcols[:, None] * X_STRIDE + ks[None, :]
            x_ok = (mcols < M)[:, None] & k_ok[None, :]
            xt = tl.load(x_ptrs, mask=x_ok, other=0.0)
            if SILU_MUL:
                up = tl.load(x_ptrs + K, mask=x_ok, other=0.0)
                xt = silu_mul_values(xt, up, elem)
            if ADD_NORM:
                h_off = mcols[:, None] * K + ks[None, :]
                h, xt = _add_norm_input(xt, tl.load(res_ptr + h_off, mask=x_ok, other=0.0),
                                        nw_ptr, ks[None, :], k_ok[None, :], elem)
                tl.store(res_out_ptr + h_off, h.to(elem), mask=x_ok & (pid_n == 0))
                squares += tl.sum(h * h, axis=1)
                xt = xt.to(elem)
            if W_SCALE:  # fp8 or int8 -> x's dtype is exact
                w = w.to(elem)
            acc += tl.dot(w, tl.trans(xt), input_precision=DOT_PRECISION)
        else:
            wf = w.to(tl.float32)
            for m in tl.static_range(M):
                if EVEN_K:
                    xm = tl.load(x_ptr + m * X_STRIDE + ks)
                else:
                    xm = tl.load(x_ptr + m * X_STRIDE + ks, mask=k_ok, other=0.0)
                if SILU_MUL:
                    if EVEN_K:
                        um = tl.load(x_ptr + m * X_STRIDE + K + ks)
                    else:
                        um = tl.load(x_ptr + m * X_STRIDE + K + ks, mask=k_ok, other=0.0)
                    xm = silu_mul_values(xm, um, elem)
                if ADD_NORM:
                    h, xm = _add_norm_input(
                        xm, tl.load(res_ptr + m * K + ks, mask=k_ok, other=0.0), nw_ptr, ks,
                        k_ok, elem)
                    tl.store(res_out_ptr + m * K + ks, h.to(elem), mask=k_ok & (pid_n == 0))
                    squares += tl.where(mcols == m, tl.sum(h * h), 0.0)
                part = tl.sum(wf * xm.to(tl.float32)[None, :], axis=1)
                acc += tl.where(mcols[None, :] == m, part[:, None], 0.0)
        w_ptrs += BLOCK_K
    if W_SCALE:
        acc *= tl.load(ws_ptr + rows_ld)[:, None]
    if ADD_NORM:
        acc *= tl.math.rsqrt(squares / K + eps)[None, :]

    out = mcols[None, :] * N + rows[:, None]
    out_ok = (rows < N)[:, None] & (mcols < M)[None, :]
    if SPLIT_MODE == 0:
        tl.store(y_ptr + out, acc.to(y_ptr.dtype.element_ty), mask=out_ok)
    elif SPLIT_MODE == 3:
        tl.atomic_add(part_ptr + out, acc, mask=out_ok, sem="relaxed")
    else:
        tl.store(part_ptr + pid_k * (M * N) + out, acc, mask=out_ok)
        if SPLIT_MODE == 1:
            # CUTLASS's semaphore: every thread's partial is stored before the barrier,
            # and the counter's release (one thread) is ordered after it.
            tl.debug_barrier()
            arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
            if arrived == SPLIT_K - 1:
                total = tl.zeros([BLOCK_N, M_PAD], dtype=tl.float32)
                for s in tl.static_range(SPLIT_K):
                    # .cg: from L2, where the other programs' partials are, never from L1.
                    total += tl.load(part_ptr + s * (M * N) + out, mask=out_ok, other=0.0,
                                     cache_modifier=".cg")
                tl.store(y_ptr + out, total.to(y_ptr.dtype.element_ty), mask=out_ok)
                tl.store(count_ptr + pid_n, 0)  # ready for the next call


@triton.jit
def _split_k_reduce_kernel(part_ptr, y_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr,
                          PDL: tl.constexpr = False):
    if PDL:
        pdl.wait_then_release()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        total += tl.load(part_ptr + s * MN + offs, mask=ok, other=0.0)
    tl.store(y_ptr + offs, total.to(y_ptr.dtype.element_ty), mask=ok)



def gemv(x: torch.Tensor, weight: torch.Tensor, *, silu_mul_input: bool = False,
         weight_scale: torch.Tensor | None = None, config: GemvConfig | dict | None = None,
         compile_only: bool = False) -> torch.Tensor:
    """x [M, K] (or [M, 2K] = [gate | up] with silu_mul_input) times weight [N, K]^T, for
    1 <= M <= MAX_M; returns a new [M, N] tensor of x's dtype. Both contiguous, on one
    device, of one dtype (bfloat16, float16 or float32); or weight float8_e4m3fn or int8 with
    weight_scale, float32 [N] or [N, 1]: each row's sums times its scale, x unquantized
    (W8A16). config: a GemvConfig, a dict of its fields, or None for `default_config`.
    compile_only: compile the kernels this call needs and run nothing (inside
    compile_pool, on its threads); the tensor returned is unwritten."""
    m, k, n = _check_inputs(x, weight, silu_mul_input, weight_scale)
    return _launch(x, weight, _resolve_config(config, m, n, k), compile_only,
                   silu_mul_input=silu_mul_input, weight_scale=weight_scale)


def add_rms_norm_gemv(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                      eps: float, weight: torch.Tensor, *,
                      weight_scale: torch.Tensor | None = None,
                      config: GemvConfig | dict | None = None,
                      compile_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) @ weight^T, x + residual): a decoder's residual add and
    RMSNorm (`loom.layers.norm.fused_add_rms_norm`) applied by the GEMV as it reads its
    input, so that no norm kernel runs before it. x and residual [M, K] alike; norm_weight
    [K]; otherwise (weight_scale too) as `gemv`, but the config must not split K (None:
    `default_config` without its split), since each program needs whole rows for their
    sums of squares.

    x + residual rounds as the reference's add does (the residual out is the same bits).
    The product sums W (norm weight * h) and scales each row's sums by 1 / RMS(h) at the
    end, where the reference rounds the normalised row to the dtype before the product: in
    float32 the two agree to float32 rounding, in 16-bit dtypes to about one rounding of
    the dtype. (A pass over the rows for their RMS before the weight streamed cost 1-13 us
    a call on an H200: run_zzz24.)"""
    m, k, n = _check_inputs(x, weight, False, weight_scale)
    cfg = dataclasses.replace(default_config(m, n, k), split_k=1) if config is None \
        else _resolve_config(config, m, n, k)
    if cfg.split_k != 1:
        raise ValueError(f"add_rms_norm_gemv: the config must not split K (split_k=1), got "
                         f"{cfg.describe()}")
    if residual.shape != x.shape or residual.dtype != x.dtype \
            or not residual.is_contiguous() or residual.device != x.device:
        raise ValueError(f"add_rms_norm_gemv: residual must be contiguous and match x "
                         f"{tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} "
                         f"{residual.dtype}")
    if norm_weight.shape != (k,) or not norm_weight.is_contiguous() \
            or norm_weight.device != x.device:
        raise ValueError(f"add_rms_norm_gemv: norm_weight must be a contiguous [{k}] tensor "
                         f"on {x.device}, got {tuple(norm_weight.shape)}")
    residual_out = torch.empty_like(x)
    y = _launch(x, weight, cfg, compile_only, weight_scale=weight_scale,
                norm=(residual, norm_weight, residual_out, float(eps)))
    return y, residual_out


def _launch(x: torch.Tensor, weight: torch.Tensor, cfg: GemvConfig, compile_only: bool,
            silu_mul_input: bool = False, norm: tuple | None = None,
            weight_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The GEMV's kernels for checked arguments; norm: (residual, norm_weight,
    residual_out, eps) of add_rms_norm_gemv."""
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    block_k = min(cfg.block_k, max(16, next_power_of_2(cdiv(k, cfg.split_k))))
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    n_blocks = cdiv(n, cfg.block_n)
    split_k = cfg.split_k
    mode = 0 if split_k == 1 else 1 + SPLIT_MODES.index(cfg.split_mode)
    part = y  # unused placeholders keep one signature
    counters = y
    if mode == 1:
        counters = arrival.counters(x.device, n_blocks, "gemv")
        part = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
    elif mode == 2:
        part = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
    elif mode == 3:
        part = torch.zeros((m, n), dtype=torch.float32, device=x.device)
    residual, norm_weight, residual_out, eps = norm or (y, y, y, 0.0)
    use_pdl = pdl.enabled(x.device)
    ahead = 0
    if use_pdl and weight.data_ptr() % 16 == 0:
        ahead = prefetch_bytes(cfg, block_k, n, k, weight.element_size(),
                               envs.pdl_prefetch_bytes())
    launch_or_compile(_gemv_kernel, (n_blocks, split_k), compile_only)(
        x, weight, y if weight_scale is None else weight_scale, y, part, counters, residual,
        norm_weight, residual_out, eps, n,
        M=m, K=k, BLOCK_N=cfg.block_n, BLOCK_K=block_k, SPLIT_K=split_k, SPLIT_MODE=mode,
        USE_DOT=cfg.use_dot, SILU_MUL=silu_mul_input, EVEN_N=n % cfg.block_n == 0,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        NUM_STAGES=cfg.num_stages, PDL=use_pdl, PREFETCH_BYTES=ahead,
        ADD_NORM=norm is not None, W_SCALE=weight_scale is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=use_pdl)
    if mode == 2:
        block = 1024
        launch_or_compile(_split_k_reduce_kernel, (cdiv(m * n, block),), compile_only)(
            part, y, m * n, SPLIT_K=split_k, BLOCK=block, PDL=use_pdl, num_warps=4,
            launch_pdl=use_pdl)
    elif mode == 3 and not compile_only:
        y.copy_(part)
    return y
