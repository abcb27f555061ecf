"""Greedy and temperature sampling in two small kernels, for rows with no top-k/top-p/min-p.

A random draw with temperature T is the Gumbel-max trick: argmax(x / T + g) with g i.i.d.
Gumbel(0, 1) draws from softmax(x / T) (the log form of the sampler's exponential race).
So no softmax is needed, only one argmax with noise added on the fly. A greedy row is the
same argmax without the noise.

Why a kernel: at batch 1 PyTorch runs its softmax and its argmax over a 128k vocabulary in
one thread block each, 33 us and 27 us of a 4.85 ms H200 decode step (profile at 94c6b95).
Here each row is cut into chunks that run in parallel (stage 1), then one program per row
picks the best chunk (stage 2). Ties go to the lowest index, like torch.argmax.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loom.kernels.host import cdiv, next_power_of_2
from loom.kernels.launch import fast_launch

CHUNK = 4096
"""Vocabulary entries per stage-1 program."""


@triton.jit(do_not_specialize=["seed"])
def _chunk_argmax_kernel(
    logits_ptr, temperature_ptr, greedy_ptr, best_val_ptr, best_idx_ptr,
    vocab_size, stride_row, num_chunks, seed,
    RANDOM: tl.constexpr, HAS_GREEDY: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    ok = cols < vocab_size
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + cols, mask=ok,
                other=float("-inf")).to(tl.float32)
    if RANDOM:
        # Philox per (row, column): a row's draw does not depend on the others'.
        u = tl.rand(seed, row * vocab_size + cols)
        gumbel = -tl.log(-tl.log(u))  # u = 0 gives -inf: that entry just never wins
        noisy = x / tl.load(temperature_ptr + row) + gumbel
        if HAS_GREEDY:
            greedy = tl.load(greedy_ptr + row) != 0
            x = tl.where(greedy, x, noisy)
        else:
            x = noisy
    x = tl.where(ok, x, float("-inf"))
    best = tl.argmax(x, axis=0, tie_break_left=True)
    out = row * num_chunks + chunk
    tl.store(best_val_ptr + out, tl.max(x, axis=0))
    tl.store(best_idx_ptr + out, chunk * BLOCK + best)


@triton.jit
def _row_argmax_kernel(best_val_ptr, best_idx_ptr, out_ptr, num_chunks,
                       CHUNKS_PAD: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, CHUNKS_PAD)
    vals = tl.load(best_val_ptr + row * num_chunks + c, mask=c < num_chunks,
                   other=float("-inf"))
    # An all -inf row (everything masked) still gets chunk 0's index, as argmax would.
    pick = tl.argmax(vals, axis=0, tie_break_left=True)
    tl.store(out_ptr + row, tl.load(best_idx_ptr + row * num_chunks + pick).to(tl.int64))


def supports(logits: torch.Tensor) -> bool:
    """2-D logits whose Philox offsets (row * vocab + column) fit in int32."""
    return logits.dim() == 2 and logits.stride(1) == 1 and logits.numel() < 2**31


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor | None = None,
                greedy_mask: torch.Tensor | None = None, seed: int = 0,
                chunk: int = CHUNK) -> torch.Tensor:
    """[B, V] logits -> [B] int64 tokens. temperature None: every row greedy. Otherwise each
    row draws from softmax(logits / temperature), except rows where greedy_mask is set."""
    if not supports(logits):
        raise ValueError(f"sample_rows: needs 2-D row-contiguous logits under 2**31 entries, "
                         f"got shape {tuple(logits.shape)} strides {logits.stride()}")
    rows, vocab = logits.shape
    num_chunks = cdiv(vocab, chunk)
    best_val = torch.empty(rows, num_chunks, dtype=torch.float32, device=logits.device)
    best_idx = torch.empty(rows, num_chunks, dtype=torch.int32, device=logits.device)
    out = torch.empty(rows, dtype=torch.long, device=logits.device)
    if rows == 0:
        return out
    random = temperature is not None
    fast_launch(_chunk_argmax_kernel, (rows, num_chunks))(
        logits, temperature if random else logits, greedy_mask if greedy_mask is not None
        else logits, best_val, best_idx, vocab, logits.stride(0), num_chunks, seed,
        RANDOM=random, HAS_GREEDY=greedy_mask is not None, BLOCK=chunk,
        num_warps=8 if chunk >= 2048 else 4)
    fast_launch(_row_argmax_kernel, (rows,))(best_val, best_idx, out, num_chunks,
                                             CHUNKS_PAD=next_power_of_2(num_chunks))
    return out
