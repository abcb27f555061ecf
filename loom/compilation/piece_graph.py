"""CUDA graphs of pieces at one token count (`cudagraph_mode: FULL_AND_PIECEWISE`).

An eagerly run prefill spends host time on every piece: Inductor's wrapper, a few cuBLAS and
Triton launches and a collective, ~1 ms a layer at TP=2. Up to ~2048 tokens that is more
than the GPU's work (docs/performance.md). At one token count (a compile_sizes entry, or a
size the model runner pads batches up to) a piece always runs the same kernels on the same
shapes, so it is captured once and then replayed. Attention stays eager between the
pieces: its metadata changes from batch to batch.

A replay reads its inputs from the addresses they had at capture. The capture's own
argument tensors are kept as the static inputs. Where a later call's argument lives
elsewhere (attention's output, allocated eagerly), it is copied in first. A piece's output
is the previous piece's static input, so it is already in place. All pieces share one
memory pool and are captured in call order, so a replay reuses memory exactly as the
capture did.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

_pool = None


def _shared_pool():
    global _pool
    if _pool is None:
        _pool = torch.cuda.graph_pool_handle()
    return _pool


def can_capture(args: list) -> bool:
    """CUDA graphs need the piece to run on a CUDA device."""
    return any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)


def inside_capture() -> bool:
    """Whether a whole-forward CUDA graph (a decode batch size) is being captured now: a
    piece then runs its kernels into that graph, neither capturing nor replaying its own."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class PieceGraph:
    """One call of `fn` captured; calling it replays with the new arguments copied in."""

    def __init__(self, fn, args: list) -> None:
        self.args = list(args)
        """The static inputs: the capture call's own arguments, kept alive."""
        self.out = self._capture(fn, self.args)
        """Capturing ran nothing: the capturing call's results come from its first replay."""

    def _capture(self, fn, args: list):
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: the NCCL watchdog thread may query the events of collectives run
        # eagerly just before; in the default (global) mode that would void the capture.
        with torch.cuda.graph(self.graph, pool=_shared_pool(), capture_error_mode="thread_local"):
            return fn(*args)

    def _replay(self) -> None:
        self.graph.replay()

    def __call__(self, *args):
        if len(args) != len(self.args):
            raise RuntimeError(f"piece graph: captured with {len(self.args)} arguments, "
                               f"called with {len(args)}")
        for static, arg in zip(self.args, args):
            if isinstance(arg, torch.Tensor):
                if arg.data_ptr() != static.data_ptr():
                    static.copy_(arg)
            elif arg != static:
                raise RuntimeError(f"piece graph: captured with {static!r}, called with {arg!r}")
        self._replay()
        return self.out


class CaptureLog:
    """One compiled forward's captures, per token count: one line as a size's capture
    starts, one when its last piece is in, with the GPU memory the graphs reserved (their
    pool, and every piece's outputs kept alive for the replays)."""

    def __init__(self) -> None:
        self.num_pieces = 0
        """Set by the backend once it has built every piece."""
        self.sizes: dict[int, list[int]] = {}
        """num_tokens -> [pieces captured, pieces failed, bytes reserved before the first]."""

    def capture(self, fn, args: list, num_tokens: int) -> PieceGraph | None:
        """The piece's graph, or None (logged) where capturing fails: it then runs eagerly."""
        state = self.sizes.get(num_tokens)
        if state is None:
            state = self.sizes[num_tokens] = [0, 0, _reserved()]
            logger.info("piecewise CUDA graphs: capturing the pieces for %d tokens", num_tokens)
        try:
            graph = PieceGraph(fn, args)
            state[0] += 1
        except RuntimeError as e:
            logger.warning("piecewise CUDA graph for %d tokens could not be captured (%s); that "
                           "piece runs without one", num_tokens, str(e).splitlines()[0])
            graph = None
            state[1] += 1
        if state[0] + state[1] == self.num_pieces:
            logger.info("piecewise CUDA graphs for %d tokens: %d of %d pieces captured, %.2f GB "
                        "more GPU memory reserved", num_tokens, state[0], self.num_pieces,
                        (_reserved() - state[2]) / 1e9)
        return graph


def _reserved() -> int:
    """GPU memory the allocator holds, its cache of free blocks emptied first: every capture
    (`torch.cuda.graph`) empties it anyway, so without this the blocks that the first capture
    frees would count against the graphs (run_w logged -0.84 GB for 128 tokens)."""
    if not torch.cuda.is_available():
        return 0
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved()
