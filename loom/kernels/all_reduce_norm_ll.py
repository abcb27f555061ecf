"""The all-reduce + residual add + RMSNorm kernel over symmetric memory with flags inside
the data (LOOM_AR_NORM_LL=1, TP decode): NCCL's "low latency" protocol.

`kernels/all_reduce_norm.py`'s kernel hands each row over with two handshakes: the peer's
"ready" counter, signalled with a system-scope release after the row's stores, and a
"read" counter back before the buffer may be written again; on an H200 pair the call took
~7 us, ~0.45 ms of a TP=2 decode token over its 64 calls. Here a row travels as 8-byte
words, each holding two 16-bit values and the call's epoch: an 8-byte store lands whole,
so a reader that sees the epoch in a word sees its values too. No fence, no counter, and
the peer's row is valid the moment its last word lands: one program per row

  1. stores its row's words (values of x, epoch) into slot `rank` of every peer's buffer;
  2. polls its own buffer's peer slots until every word carries this call's epoch, then
     sums all ranks' rows in rank order (every rank computes the same bits), adds the
     residual and normalises, as the other kernel does.

Two buffers alternate by the epoch's parity, so no "read" handshake is needed: before a
rank writes buffer b again (call c + 2) it has read the peer's row of call c + 1, which the
peer wrote after its call c, the last reader of b, had finished. The epoch is a per-rank
count of calls (kept on the GPU; every rank makes the same calls in the same order); it
skips 0, the value of a buffer never written. 16-bit dtypes only (two values a word).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loom.kernels import pdl
from loom.kernels.host import next_power_of_2

MAX_SPIN = 1 << 26
"""Polls before a program gives up on its peer (tens of seconds at ~1 us a poll): a peer
that never arrives has died or hangs. The program then traps (`give_up_unless`) rather
than carry on with whatever the peer's buffer held. Read at each launch (a constexpr):
tests lower it."""


@triton.jit
def give_up_unless(arrived):
    """Trap where `arrived` (a scalar) is false: the kernel aborts, the CUDA context with
    it, and the process's next CUDA call raises, so the worker fails and the engine
    reports which rank, instead of every later collective summing stale or half-written
    rows and the ranks' counters drifting apart for good."""
    if not arrived:
        tl.inline_asm_elementwise("trap; // $0", "=r", [], dtype=tl.int32, is_pure=False,
                                  pack=1)


@triton.jit
def _halves(d32):
    """The bits of the two 16-bit values in 32-bit words: the low half (the first value in
    memory), then the high half, each in an int32."""
    return d32 & 0xFFFF, (d32 >> 16) & 0xFFFF


@triton.jit
def _to_f32(bits, BF16: tl.constexpr):
    """16-bit values' bits (bfloat16 with BF16, else float16) as float32, exactly."""
    if BF16:
        return (bits << 16).to(tl.float32, bitcast=True)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _to_bits(v, BF16: tl.constexpr):
    """float32 values rounded to the 16-bit dtype, as their bits in an int32."""
    if BF16:
        return v.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return v.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def _round(v, BF16: tl.constexpr):
    """float32 values rounded to the 16-bit dtype and back."""
    if BF16:
        return v.to(tl.bfloat16).to(tl.float32)
    return v.to(tl.float16).to(tl.float32)


@triton.jit(do_not_specialize=["rank"])  # one binary for every rank
def _ll_all_reduce_add_rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, ll_ptrs, state_ptr, rank, eps,
    stride_x, stride_r, stride_o, stride_ro,
    N: tl.constexpr, BLOCK: tl.constexpr, WORLD: tl.constexpr, MAX_ROWS: tl.constexpr,
    ROW_WORDS: tl.constexpr, BF16: tl.constexpr, PDL: tl.constexpr = False,
    SPIN: tl.constexpr = MAX_SPIN,
):
    # Strides in 32-bit words (pairs of values); BLOCK covers N // 2 pairs.
    if PDL:  # launched early (loom/kernels/pdl.py): x is the previous kernel's output
        pdl.wait_then_release()
    row = tl.program_id(0)
    pairs = tl.arange(0, BLOCK)
    ok = pairs < N // 2
    # Every load that does not wait for the peer is issued first, with no branch between
    # them, so that their round trips overlap each other and the poll's.
    last = tl.load(state_ptr, volatile=True)  # the epoch of this rank's last completed call
    x32 = tl.load(x_ptr + row * stride_x + pairs, mask=ok, other=0)
    r32 = tl.load(res_ptr + row * stride_r + pairs, mask=ok, other=0)
    w32 = tl.load(w_ptr + pairs, mask=ok, other=0)
    mine = tl.load(ll_ptrs + rank).to(tl.pointer_type(tl.int64))
    epoch = tl.where(last >= 2147483647, 1, last + 1)
    parity = epoch & 1
    word = (epoch.to(tl.int64) << 32) | (x32.to(tl.int64) & 0xFFFFFFFF)
    for p in tl.static_range(WORLD):
        dst = tl.load(ll_ptrs + p).to(tl.pointer_type(tl.int64)) \
            + ((parity * WORLD + rank) * MAX_ROWS + row) * ROW_WORDS
        tl.store(dst + pairs, word, mask=ok & (p != rank))
    lo = tl.zeros([BLOCK], tl.float32)
    hi = tl.zeros([BLOCK], tl.float32)
    for p in tl.static_range(WORLD):
        if p == rank:
            d32 = x32
        else:
            src = mine + ((parity * WORLD + p) * MAX_ROWS + row) * ROW_WORDS + pairs
            got = tl.load(src, mask=ok, other=0, volatile=True)
            missing = tl.sum((((got >> 32).to(tl.int32) != epoch) & ok).to(tl.int32), axis=0)
            spins = 0
            while (missing > 0) & (spins < SPIN):
                got = tl.load(src, mask=ok, other=0, volatile=True)
                missing = tl.sum((((got >> 32).to(tl.int32) != epoch) & ok).to(tl.int32),
                                 axis=0)
                spins += 1
            give_up_unless(missing == 0)
            d32 = (got & 0xFFFFFFFF).to(tl.int32)
        a, b = _halves(d32)
        lo += _to_f32(a, BF16)
        hi += _to_f32(b, BF16)
    # The reference's roundings, as in kernels/all_reduce_norm.py: the all-reduce's
    # output, x + residual, the normalised value and its product with the weight.
    r_lo, r_hi = _halves(r32)
    h_lo = _round(_round(lo, BF16) + _to_f32(r_lo, BF16), BF16)
    h_hi = _round(_round(hi, BF16) + _to_f32(r_hi, BF16), BF16)
    tl.store(res_out_ptr + row * stride_ro + pairs,
             _to_bits(h_lo, BF16) | (_to_bits(h_hi, BF16) << 16), mask=ok)
    inv = tl.rsqrt((tl.sum(h_lo * h_lo, axis=0) + tl.sum(h_hi * h_hi, axis=0)) / N + eps)
    w_lo, w_hi = _halves(w32)
    o_lo = _round(h_lo * inv, BF16) * _to_f32(w_lo, BF16)
    o_hi = _round(h_hi * inv, BF16) * _to_f32(w_hi, BF16)
    tl.store(out_ptr + row * stride_o + pairs,
             _to_bits(o_lo, BF16) | (_to_bits(o_hi, BF16) << 16), mask=ok)
    # The last program to finish records the epoch; every program read it before. A
    # launch of one program (decode at batch 1) records it at once: no counter's round
    # trip at the kernel's tail.
    if tl.num_programs(0) == 1:
        tl.store(state_ptr, epoch)
    else:
        arrived = tl.atomic_add(state_ptr + 1, 1, sem="relaxed")
        if arrived == tl.num_programs(0) - 1:
            tl.store(state_ptr, epoch)
            tl.store(state_ptr + 1, 0)


def _words(t: torch.Tensor) -> torch.Tensor:
    """A [..., n] 16-bit tensor with a contiguous last dim as [..., n / 2] int32 words."""
    return t.view(torch.int32)


class LowLatencyNormBuffer:
    """One rank's share of the LL exchange: two buffers (by the epoch's parity) of a slot
    per source rank and MAX_ROWS rows of MAX_WIDTH / 2 words, each rank's address in an
    int64 device table, and this rank's epoch and arrival counter (its own GPU's)."""

    def __init__(self, rank: int, world: int, ll_ptrs: torch.Tensor, max_rows: int,
                 max_width: int) -> None:
        self.rank, self.world, self.ll_ptrs = rank, world, ll_ptrs
        self.max_rows, self.max_width = max_rows, max_width
        self.state = torch.zeros(2, dtype=torch.int32, device=ll_ptrs.device)

    @staticmethod
    def words(world: int, max_rows: int, max_width: int) -> int:
        return 2 * world * max_rows * (max_width // 2)

    def fits(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> bool:
        """16-bit rows of an even width up to max_width, at most max_rows of them, x,
        residual and weight alike in dtype, each row's start 4-byte aligned."""
        if x.dtype not in (torch.bfloat16, torch.float16) or x.dim() != 2:
            return False
        rows, n = x.shape
        return (1 <= rows <= self.max_rows and n % 2 == 0 and n <= self.max_width
                and residual.dtype == weight.dtype == x.dtype and residual.shape == x.shape
                and weight.shape == (n,) and weight.is_contiguous()
                and all(t.stride(-1) == 1 and t.stride(0) % 2 == 0 and t.data_ptr() % 4 == 0
                        for t in (x, residual)))

    def all_reduce_add_rms_norm(self, x, residual, weight, eps):
        """(norm(all_reduce(x) + residual) * weight, all_reduce(x) + residual); every rank
        of the group calls it in the same order with the same shapes."""
        if not self.fits(x, residual, weight):
            raise ValueError(f"LL all-reduce + norm: unsupported rows {tuple(x.shape)} "
                             f"{x.dtype} (16-bit, even width <= {self.max_width}, "
                             f"<= {self.max_rows} rows, 4-byte aligned)")
        return self.launch(x, residual, weight, eps)

    def launch(self, x, residual, weight, eps):
        """`all_reduce_add_rms_norm` for arguments `fits` has accepted."""
        rows, n = x.shape
        out = torch.empty_like(x)
        res_out = torch.empty_like(x)
        use_pdl = pdl.enabled(x.device)
        block = next_power_of_2(n // 2)
        _ll_all_reduce_add_rms_norm_kernel[(rows,)](
            _words(x), _words(residual), _words(weight), _words(out),
            _words(res_out), self.ll_ptrs, self.state, self.rank, eps,
            x.stride(0) // 2, residual.stride(0) // 2, n // 2, n // 2,
            N=n, BLOCK=block, WORLD=self.world, MAX_ROWS=self.max_rows,
            ROW_WORDS=self.max_width // 2, BF16=x.dtype == torch.bfloat16, PDL=use_pdl,
            SPIN=MAX_SPIN, num_warps=max(1, min(8, block // 256)),
            launch_pdl=use_pdl)
        return out, res_out
