"""CUDA graphs of pieces at one token count (`cudagraph_mode: FULL_AND_PIECEWISE`).

An eagerly run prefill spends host time on every piece: Inductor's wrapper, a few cuBLAS and
Triton launches and a collective, 0.7-1.5 ms a layer (docs/performance.md). Up to ~2048
tokens that can be more than the GPU's work. At one token count (a compile_sizes entry, or a
size the model runner pads batches up to) a piece always runs the same kernels on the same
shapes, so it is captured once and then replayed. Attention stays eager between the
pieces: its metadata changes from batch to batch.

A replay reads its inputs from the addresses they had at capture, and writes its outputs
where the capture did. Memory does not grow with the number of sizes:
- A piece's outputs live in the compiled forward's graph pool, and the graphs keep no
  reference to them (a weak alias, `_weak_alias`): the capturing forward frees each
  as its last user is done, as an eager forward would, and the next capture reuses the
  memory. Every forward replays the pieces of one size in the order they were captured,
  and no two forwards overlap, so a replay reuses memory exactly as its capture did.
- An input made eagerly (attention's output, the step's input ids) is copied into a slot
  of the piece (`InputSlots`): one buffer per input, shared by the graphs of every size.
- Parameters, and inputs of another shape, are kept as they were given.
"""

from __future__ import annotations

import contextlib
import logging

import torch

logger = logging.getLogger(__name__)
_quiet = False
"""Set by `quiet()`: a size's capture lines go to DEBUG (the caller sums them up)."""


@contextlib.contextmanager
def quiet():
    global _quiet
    previous, _quiet = _quiet, True
    try:
        yield
    finally:
        _quiet = previous


def can_capture(args: list) -> bool:
    """CUDA graphs need the piece to run on a CUDA device."""
    return any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)


def inside_capture() -> bool:
    """Whether a whole-forward CUDA graph (a decode batch size) is being captured now: a
    piece then runs its kernels into that graph, neither capturing nor replaying its own."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _weak_alias(t):
    """A tensor on t's memory that does not keep that memory allocated (CUDA tensors of the
    graph pool only: on the CPU a freed block goes straight back to any allocation)."""
    if not isinstance(t, torch.Tensor) or not t.is_cuda:
        return t
    storage = t.untyped_storage()
    weak = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), t.device,
                                                         storage.nbytes())
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(weak, t.storage_offset(),
                                                               t.shape, t.stride())


def _tensors(out) -> tuple:
    return tuple(out) if isinstance(out, tuple | list) else (out,)


class InputSlots:
    """A piece's eagerly made inputs, one buffer each shared by every size's graph: only one
    size runs at a time, so each graph's static input is the first rows of the buffer."""

    def __init__(self, max_tokens) -> None:
        self.max_tokens = max_tokens
        """() -> the most tokens any graph of the piece is captured at."""
        self.buffers: dict[tuple, torch.Tensor] = {}

    def slot(self, index: int, arg: torch.Tensor, num_tokens: int) -> torch.Tensor | None:
        """The static input for argument `index`, its first `num_tokens` rows; None where the
        argument is not one row per token."""
        if arg.dim() == 0 or arg.shape[0] != num_tokens or not arg.is_contiguous():
            return None
        key = (index, arg.dtype, arg.device, tuple(arg.shape[1:]))
        buffer = self.buffers.get(key)
        if buffer is None or buffer.shape[0] < num_tokens:
            # A larger size than planned: earlier graphs keep the old buffer (their view).
            rows = max(self.max_tokens(), num_tokens)
            buffer = self.buffers[key] = torch.empty((rows, *arg.shape[1:]), dtype=arg.dtype,
                                                     device=arg.device)
        return buffer[:num_tokens]


class PieceGraph:
    """One call of `fn` captured; calling it replays with the new arguments copied in."""

    def __init__(self, fn, args: list, log: CaptureLog, slots: InputSlots | None = None,
                 num_tokens: int | None = None) -> None:
        static = []
        for i, arg in enumerate(args):
            slot = None
            if slots is not None and isinstance(arg, torch.Tensor) \
                    and not isinstance(arg, torch.nn.Parameter) and not log.in_pool(arg):
                slot = slots.slot(i, arg, num_tokens)
            if slot is not None:
                slot.copy_(arg)
            static.append(arg if slot is None else slot)
        out = self._capture(fn, static, log)
        inputs = {a.untyped_storage().data_ptr() for a in static if isinstance(a, torch.Tensor)}
        log.add_pool_outputs(t for t in _tensors(out) if isinstance(t, torch.Tensor)
                             and t.untyped_storage().data_ptr() not in inputs)
        self.first = out
        """The capturing call's own outputs, handed back once: that forward frees them as
        their users finish, so later captures reuse the memory."""
        self.args = [_weak_alias(a) if isinstance(a, torch.Tensor) and log.in_pool(a) else a
                     for a in static]
        """The static inputs: slots, parameters, and weak aliases of earlier pieces' outputs."""
        weak = [_weak_alias(t) for t in _tensors(out)]
        self.out = type(out)(weak) if isinstance(out, tuple | list) else weak[0]
        """What every later replay returns: weak aliases of the capture's outputs."""

    def _capture(self, fn, args: list, log: CaptureLog):
        """Capturing runs nothing: the capturing call's results come from its first replay."""
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: the NCCL watchdog thread may query the events of collectives run
        # eagerly just before; in the default (global) mode that would void the capture.
        with torch.cuda.graph(self.graph, pool=log.pool(), capture_error_mode="thread_local"):
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
        out, self.first = (self.out if self.first is None else self.first), None
        return out


class CaptureLog:
    """One compiled forward's captures, per token count: one line as a size's capture
    starts, one when its last piece is in, with the GPU memory the graphs reserved (their
    pool's growth, and the pieces' input slots). It owns the forward's graph pool."""

    def __init__(self) -> None:
        self.num_pieces = 0
        """Set by the backend once it has built every piece."""
        self.sizes: dict[int, list[int]] = {}
        """num_tokens -> [pieces captured, pieces failed, bytes reserved before the first]."""
        self._pool = None
        self._pool_storages: set[int] = set()
        """Addresses of the pieces' outputs' storages: memory of the pool, which no eager
        tensor shares while these graphs live."""

    def pool(self):
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def add_pool_outputs(self, tensors) -> None:
        self._pool_storages.update(t.untyped_storage().data_ptr() for t in tensors if t.is_cuda)

    def in_pool(self, t: torch.Tensor) -> bool:
        return t.is_cuda and t.untyped_storage().data_ptr() in self._pool_storages

    def capture(self, fn, args: list, num_tokens: int,
                slots: InputSlots | None = None) -> PieceGraph | None:
        """The piece's graph, or None (logged) where capturing fails: it then runs eagerly."""
        state = self.sizes.get(num_tokens)
        if state is None:
            state = self.sizes[num_tokens] = [0, 0, reserved()]
            (logger.debug if _quiet else logger.info)(
                "piecewise CUDA graphs: capturing the pieces for %d tokens", num_tokens)
        try:
            graph = PieceGraph(fn, args, self, slots, num_tokens)
            state[0] += 1
        except RuntimeError as e:
            if not state[1]:  # once a size: a failure (out of memory) tends to repeat
                logger.warning("piecewise CUDA graph for %d tokens could not be captured (%s); "
                               "that piece runs without one", num_tokens,
                               str(e).splitlines()[0])
            graph = None
            state[1] += 1
        if state[0] + state[1] == self.num_pieces:
            (logger.warning if state[1] else logger.debug if _quiet else logger.info)(
                "piecewise CUDA graphs for %d tokens: %d of %d pieces captured, %.2f GB more "
                "GPU memory reserved", num_tokens, state[0], self.num_pieces,
                (reserved() - state[2]) / 1e9)
        return graph


def reserved() -> int:
    """GPU memory the allocator holds, its cache of free blocks emptied first: every capture
    (`torch.cuda.graph`) empties it anyway, so without this the blocks that the first capture
    frees would count against the graphs (run_w logged -0.84 GB for 128 tokens)."""
    if not torch.cuda.is_available():
        return 0
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved()
