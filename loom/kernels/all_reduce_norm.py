"""All-reduce, residual add and RMSNorm in one kernel, over symmetric memory (TP decode).

At batch 1 a TP=2 decode step runs 64 all-reduces of one 8 KB row, each followed by the
residual add + RMSNorm that Inductor fuses into its own kernel: two launches of a few
microseconds each, 64 times a token. Here one program per row does both:

  1. wait until every peer has finished reading this rank's buffer row (previous call);
  2. copy its row of x into this rank's symmetric buffer and signal every peer;
  3. wait for every peer's signal, then sum all ranks' rows in rank order (so every rank
     computes bit-identical sums), add the residual and normalise;
  4. tell every peer that its row has been read.

With PUSH (LOOM_AR_NORM_PUSH=1) step 2 writes the row into slot `rank` of every rank's
buffer (posted stores over NVLink) and step 3 sums the slots of this rank's own buffer: no
remote read waits on the critical path. "Read" then means a peer has summed the slot this
rank pushed into its buffer.

Signals are counters in a flag area of the same symmetric allocation: a peer adds 1 with
release semantics at system scope; the waiter spins with acquire reads and takes the 1
back. The "read" counters start at 1, so the first call does not wait. Calls must be made
by every rank in the same order with the same shapes, as for any collective.

With WORLD == 1 the kernel is a plain fused add + RMSNorm of x (no flags, no buffers):
the fallback after an NCCL all-reduce on larger batches, and what the CPU tests run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loom import envs
from loom.distributed.ops import FUSED_NORM_MAX_ROWS
from loom.kernels import all_reduce_norm_ll, pdl
from loom.kernels.all_reduce_norm_ll import LowLatencyNormBuffer, give_up_unless
from loom.kernels.host import next_power_of_2
from loom.kernels.launch import fast_launch


@triton.jit
def _take_signal(flag, SPIN: tl.constexpr):
    """Wait for the flag's count, then take one. After SPIN polls (all_reduce_norm_ll's
    MAX_SPIN, tens of seconds) the peer has died or hangs: trap (`give_up_unless`); a GPU
    spinning forever would hide it, and going on would read a row the peer never wrote."""
    seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
    spins = 0
    while (seen < 1) & (spins < SPIN):
        seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
        spins += 1
    give_up_unless(seen >= 1)
    tl.atomic_add(flag, -1, sem="relaxed", scope="sys")


@triton.jit(do_not_specialize=["rank"])  # one binary for every rank (Triton would make rank 1's)
def _all_reduce_add_rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, data_ptrs, flag_ptrs, rank, eps,
    stride_x, stride_r, stride_o, stride_ro,
    N: tl.constexpr, BLOCK: tl.constexpr, WORLD: tl.constexpr, MAX_ROWS: tl.constexpr,
    PUSH: tl.constexpr = False, SLOT: tl.constexpr = 0, PDL: tl.constexpr = False,
    SPIN: tl.constexpr = all_reduce_norm_ll.MAX_SPIN,
):
    if PDL:  # launched early (loom/kernels/pdl.py): x is the previous kernel's output
        pdl.wait_then_release()
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    dtype = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols, mask=ok, other=0.0)
    if WORLD == 1:
        total = x.to(tl.float32)
    else:
        # flags of a rank: [ready | read][source rank][row], int32 counters
        mine = tl.load(flag_ptrs + rank).to(tl.pointer_type(tl.int32))
        for p in tl.static_range(WORLD):
            if p != rank:
                _take_signal(mine + (WORLD + p) * MAX_ROWS + row, SPIN)
        if PUSH:  # slot `rank` of every rank's buffer, this rank's own included
            for p in tl.static_range(WORLD):
                dst = tl.load(data_ptrs + p).to(tl.pointer_type(dtype)) + rank * SLOT + row * N
                tl.store(dst + cols, x, mask=ok)
        else:
            buf = tl.load(data_ptrs + rank).to(tl.pointer_type(dtype))
            tl.store(buf + row * N + cols, x, mask=ok)
        tl.debug_barrier()
        for p in tl.static_range(WORLD):
            if p != rank:
                peer = tl.load(flag_ptrs + p).to(tl.pointer_type(tl.int32))
                tl.atomic_add(peer + rank * MAX_ROWS + row, 1, sem="release", scope="sys")
        for p in tl.static_range(WORLD):
            if p != rank:
                _take_signal(mine + p * MAX_ROWS + row, SPIN)
        tl.debug_barrier()
        total = tl.zeros([BLOCK], tl.float32)
        for p in tl.static_range(WORLD):
            if PUSH:
                src = tl.load(data_ptrs + rank).to(tl.pointer_type(dtype)) + p * SLOT + row * N
            else:
                src = tl.load(data_ptrs + p).to(tl.pointer_type(dtype)) + row * N
            src = tl.multiple_of(src, 16)  # rows start 16-byte aligned: wide loads
            # .cg: from L2 / the peer, never a line left in L1 by the previous call
            total += tl.load(src + cols, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
        tl.debug_barrier()
        for p in tl.static_range(WORLD):
            if p != rank:
                peer = tl.load(flag_ptrs + p).to(tl.pointer_type(tl.int32))
                tl.atomic_add(peer + (WORLD + rank) * MAX_ROWS + row, 1, sem="release",
                              scope="sys")
    # The reference's roundings: the all-reduce's output, x + residual, the normalised
    # value and its product with the weight each land in the tensor dtype.
    reduced = total.to(dtype).to(tl.float32)
    res = tl.load(res_ptr + row.to(tl.int64) * stride_r + cols, mask=ok, other=0.0)
    added = (reduced + res.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
    tl.store(res_out_ptr + row.to(tl.int64) * stride_ro + cols, added, mask=ok)
    h = added.to(tl.float32)
    inv = tl.rsqrt(tl.sum(h * h, axis=0) / N + eps)
    normed = (h * inv).to(dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row.to(tl.int64) * stride_o + cols,
             (normed * w).to(out_ptr.dtype.element_ty), mask=ok)


def _launch(x, residual, weight, eps, data_ptrs, flag_ptrs, rank, world, max_rows,
            push=False, slot_bytes=0):
    """The kernel over x's rows (any leading dims); outputs shaped like x."""
    shape = x.shape
    x, residual = _rows(x), _rows(residual)
    num_rows, n = x.shape
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype),
                      device=x.device)
    res_out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, residual.dtype),
                          device=x.device)
    if num_rows:
        block = next_power_of_2(n)
        use_pdl = pdl.enabled(x.device)
        fast_launch(_all_reduce_add_rms_norm_kernel, (num_rows,))(
            x, residual, weight, out, res_out, data_ptrs, flag_ptrs, rank, eps,
            x.stride(0), residual.stride(0), out.stride(0), res_out.stride(0),
            N=n, BLOCK=block, WORLD=world, MAX_ROWS=max_rows,
            PUSH=push, SLOT=slot_bytes // x.element_size(), PDL=use_pdl,
            SPIN=all_reduce_norm_ll.MAX_SPIN, num_warps=max(1, min(16, block // 512)),
            launch_pdl=use_pdl)
    return out.view(shape), res_out.view(shape)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., n] as rows [m, n] with a contiguous last dim."""
    t = t.reshape(-1, t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual) * weight, x + residual) in one kernel, as `fused_add_rms_norm`."""
    return _launch(x, residual, weight, eps, None, None, 0, 1, 1)


class SymmetricNormBuffer:
    """One rank's share of the symmetric allocation the fused kernel exchanges rows through,
    and the device tables of every rank's data and flag addresses. Made by every rank of a
    group together (a rendezvous), before any CUDA graph is captured."""

    MAX_ROWS = FUSED_NORM_MAX_ROWS
    MAX_WIDTH = 16384
    BYTES = MAX_ROWS * MAX_WIDTH * 2
    """Enough for MAX_ROWS rows of a 16384-wide bfloat16 model (2 MiB per rank)."""

    def __init__(self, c10d_name: str, device: torch.device, process_group) -> None:
        import torch.distributed as dist
        from torch.distributed import _symmetric_memory as symm_mem
        world = dist.get_world_size(process_group)
        flag_words = 2 * world * self.MAX_ROWS
        self.push = envs.all_reduce_norm_push()
        data_bytes = self.BYTES * (world if self.push else 1)  # PUSH: a slot per source rank
        ll_words = LowLatencyNormBuffer.words(world, self.MAX_ROWS, self.MAX_WIDTH) \
            if envs.all_reduce_norm_ll() else 0
        ll_at = data_bytes + 4 * flag_words
        ll_at += -ll_at % 16
        self._storage = symm_mem.empty(ll_at + 8 * ll_words, dtype=torch.uint8, device=device)
        handle = symm_mem.rendezvous(self._storage, c10d_name)
        self.rank, self.world = handle.rank, handle.world_size
        flags = self._storage[data_bytes:data_bytes + 4 * flag_words].view(torch.int32) \
            .view(2, self.world, self.MAX_ROWS)
        flags[0].zero_()  # no row is ready
        flags[1].fill_(1)  # every peer has read every row (none was written)
        ptrs = [int(p) for p in handle.buffer_ptrs]
        self.data_ptrs = torch.tensor(ptrs, dtype=torch.int64, device=device)
        self.flag_ptrs = torch.tensor([p + data_bytes for p in ptrs], dtype=torch.int64,
                                      device=device)
        self.ll = None
        if ll_words:
            self._storage[ll_at:].zero_()  # epoch 0 in every word: never a call's
            self.ll = LowLatencyNormBuffer(
                self.rank, self.world,
                torch.tensor([p + ll_at for p in ptrs], dtype=torch.int64, device=device),
                self.MAX_ROWS, self.MAX_WIDTH)
        torch.cuda.synchronize(device)
        # No peer may signal into flags not yet initialised.
        index = device.index if device.index is not None else torch.cuda.current_device()
        dist.barrier(group=process_group, device_ids=[index])

    def fits(self, x: torch.Tensor) -> bool:
        rows = x.numel() // max(1, x.shape[-1])
        return (x.is_cuda and rows <= self.MAX_ROWS and x.shape[-1] <= self.MAX_WIDTH
                and x.numel() * x.element_size() <= self.BYTES)

    def all_reduce_add_rms_norm(self, x, residual, weight, eps):
        if self.ll is not None:  # LOOM_AR_NORM_LL=1: 16-bit rows take the LL kernel
            rows = (_rows(x), _rows(residual))
            if self.ll.fits(*rows, weight):
                out, res_out = self.ll.launch(*rows, weight, eps)
                return out.view(x.shape), res_out.view(x.shape)
        return _launch(x, residual, weight, eps, self.data_ptrs, self.flag_ptrs, self.rank,
                       self.world, self.MAX_ROWS, self.push, self.BYTES)
