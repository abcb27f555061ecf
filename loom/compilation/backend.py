"""torch.compile levels, vLLM's meaning.

- 0: eager. 1-2: plain `torch.compile` (Inductor) of the forward.
- 3: Dynamo captures the forward once with a dynamic token dimension; the FX graph is split
  at `splitting_ops` (attention by default; `()` keeps one graph with attention as an
  opaque custom op); each piece is compiled by Inductor for the general shape and, lazily,
  for each size in `compile_sizes`; loom's pass manager runs in Inductor's post-grad stage.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import fx

from loom.compilation import piece_graph
from loom.config import CompilationConfig
from loom.library import python_impl

if TYPE_CHECKING:  # its import brings in Dynamo and Inductor (~1 s), which level 0 never uses
    from loom.compilation.pass_manager import PassManager

logger = logging.getLogger(__name__)

DEFAULT_SPLITTING_OPS = ("loom.attention",)
_num_tokens: int | None = None
"""The running forward's token count, set by `CompiledForward` around each call."""


@contextlib.contextmanager
def _running_size(n: int):
    global _num_tokens
    previous, _num_tokens = _num_tokens, n
    try:
        yield
    finally:
        _num_tokens = previous


def _op_name(node: fx.Node) -> str | None:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return None
    return str(target).removesuffix(".default")


def split_graph(gm: fx.GraphModule, ops: tuple[str, ...]) -> tuple[fx.GraphModule, set[str]]:
    """Split gm so that every call of a splitting op is a submodule of its own; returns the
    split module and the names of the splitting-op submodules."""
    piece, split_names, ids = 0, set(), {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if _op_name(node) in ops:
            piece += 1
            ids[node] = piece
            split_names.add(f"submod_{piece}")
            piece += 1
        else:
            ids[node] = piece
    split = torch.fx.passes.split_module.split_module(gm, None, lambda n: ids[n],
                                                     keep_original_order=True)
    return split, split_names


def inductor_patches(config: CompilationConfig) -> dict:
    """The user's Inductor options, each checked against torch._inductor.config."""
    from torch._inductor import config as inductor_config
    unknown = sorted(k for k in config.inductor_compile_config
                     if not hasattr(inductor_config, k.split(".")[0]))
    if unknown:
        raise ValueError(f"compilation_config.inductor_compile_config: unknown Inductor "
                         f"option(s) {unknown}")
    return dict(config.inductor_compile_config)


class PiecewiseBackend:
    """The Dynamo backend of level 3."""

    def __init__(self, config: CompilationConfig, pass_manager: PassManager) -> None:
        self.config = config
        self.pass_manager = pass_manager
        ops = config.splitting_ops
        if ops is None and pass_manager.sp_plan.any:
            # The sharded residual stream runs through every layer: it must not cross pieces.
            logger.info("level 3: sequence parallelism compiles the whole graph "
                        "(splitting_ops=[]); attention stays an opaque op inside it")
            ops = ()
        self.splitting_ops = DEFAULT_SPLITTING_OPS if ops is None else tuple(
            op.replace("::", ".") for op in ops)
        self.piece_sizes: set[int] = set()
        """Token counts, besides compile_sizes, whose pieces are captured as CUDA graphs (the
        general graph at that size): the model runner pads batches up to them."""

    @property
    def splits_at_attention(self) -> bool:
        return any(op in self.splitting_ops for op in DEFAULT_SPLITTING_OPS)

    def __call__(self, gm: fx.GraphModule, example_inputs: list) -> Callable:
        start = time.perf_counter()
        present = {_op_name(n) for n in gm.graph.nodes}
        missing = [op for op in self.splitting_ops if op not in present]
        if missing:
            logger.warning("splitting_ops %s matched no op of the graph: not split there",
                           missing)
        split, split_names = split_graph(gm, self.splitting_ops)
        piece_inputs = _record_piece_inputs(split, example_inputs)
        compiled = 0
        captures = piece_graph.CaptureLog()
        for name, module in list(split.named_children()):
            if name in split_names:
                continue
            # The instance dict shadows the child module: the split graph's forward calls it.
            split.__dict__[name] = Piece(module, piece_inputs[name], self.config,
                                         self.pass_manager, captures, self.piece_sizes)
            compiled += 1
        captures.num_pieces = compiled
        for name in split_names:
            split.__dict__[name] = _calling_directly(getattr(split, name))
        logger.info("level 3: split the graph into %d pieces at %s; compiled %d in %.1f s",
                    len(list(split.named_children())), ", ".join(self.splitting_ops) or "nothing",
                    compiled, time.perf_counter() - start)
        return split


def _calling_directly(module: fx.GraphModule) -> Callable:
    """A splitting op's submodule as the split graph calls it: loom ops by their Python
    implementations, not through the dispatcher (~39 us of host time for the attention op,
    `loom.library`), and the module's forward without nn.Module's call path. These run
    between pieces, outside any compiled code."""
    changed = False
    for node in module.graph.nodes:
        fn = python_impl(node.target) if node.op == "call_function" else None
        if fn is not None:
            node.target, changed = fn, True
    if changed:
        module.recompile()
    return module.forward


def _record_piece_inputs(split: fx.GraphModule, example_inputs: list) -> dict[str, list]:
    """Run the split module on the (fake) example inputs, recording each piece's inputs."""
    recorded: dict[str, list] = {}

    class Recorder(fx.Interpreter):
        def call_module(self, target, args, kwargs):
            recorded[target] = list(args)
            return super().call_module(target, args, kwargs)

    fake_mode = torch._guards.detect_fake_mode(example_inputs)
    if fake_mode is None:
        Recorder(split).run(*example_inputs)
        return recorded
    # Parameters arrive as real tensors; only fake ones may flow through fake mode.
    fake_inputs = [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor)
                   and not isinstance(x, torch._subclasses.FakeTensor) else x
                   for x in example_inputs]
    with fake_mode:
        Recorder(split).run(*fake_inputs)
    return recorded


class Piece:
    """One compiled piece: Inductor's general-shape graph, plus static-shape graphs compiled
    on first use for the sizes in compile_sizes. Where a pass rewrites small batches only
    (`PassManager.range_split`), the general graph is compiled a second time for them."""

    def __init__(self, module: fx.GraphModule, example_inputs: list, config: CompilationConfig,
                 pass_manager: PassManager, captures: piece_graph.CaptureLog,
                 piece_sizes: set[int]) -> None:
        self.module = module
        self.captures = captures
        self.piece_sizes = piece_sizes
        """The backend's set, shared by every piece (filled by the model runner)."""
        self.warm: set[int] = set()
        """Sizes run once: the next run at such a size is captured."""
        self.patches = {**inductor_patches(config), "post_grad_custom_post_pass": pass_manager}
        self.compile_sizes = set(config.compile_sizes)
        self.single_output = not isinstance(module.graph.output_node().args[0], tuple | list)
        self.general = self._compile(example_inputs)
        self.static: dict[int, Callable] = {}
        self.piecewise = config.piece_graphs and not any(
            _op_name(n) in DEFAULT_SPLITTING_OPS for n in module.graph.nodes)
        """compile_sizes and the runner's padded sizes replay CUDA graphs from their second
        run (not a piece with attention inside)."""
        self.graphs: dict[int, piece_graph.PieceGraph | None] = {}
        self.slots = piece_graph.InputSlots(
            lambda: max(self.compile_sizes | self.piece_sizes, default=0))
        self.split = pass_manager.range_split
        self.small = None
        if self.split is not None:
            with pass_manager.small_range():
                self.small = self._compile(example_inputs)

    def _compile(self, inputs: list) -> Callable:
        from torch._inductor.compile_fx import compile_fx
        fn = compile_fx(self.module, inputs, config_patches=self.patches)
        if not self.single_output:
            return fn

        def unwrapped(*args):
            # Inductor may hand a single output back as a one-element list.
            out = fn(*args)
            return out[0] if isinstance(out, tuple | list) else out
        return unwrapped

    def __call__(self, *args):
        n = _num_tokens
        if n is not None and n in self.compile_sizes:
            if n not in self.static:
                start = time.perf_counter()
                self.static[n] = self._compile(list(args))
                logger.info("compiled a piece for %d tokens in %.1f s", n,
                            time.perf_counter() - start)
                self.warm.add(n)
                return self.static[n](*args)  # the first run warms up (autotuning, collectives)
            fn = self.static[n]
        elif self.small is not None and n is not None and n <= self.split:
            fn = self.small
        else:
            fn = self.general
        if not self.piecewise or n is None or (n not in self.compile_sizes
                                               and n not in self.piece_sizes) \
                or piece_graph.inside_capture():
            # Inside a decode graph's capture, that graph records the piece's kernels.
            return fn(*args)
        if n not in self.graphs:  # decided once per size, on its second run
            if n not in self.warm:
                self.warm.add(n)
                return fn(*args)
            self.graphs[n] = self.captures.capture(fn, list(args), n, self.slots) \
                if piece_graph.can_capture(list(args)) else None
        graph = self.graphs[n]
        return graph(*args) if graph is not None else fn(*args)


class CompiledForward:
    """The model's forward as the model runner calls it, compiled per the config."""

    def __init__(self, model: torch.nn.Module, config: CompilationConfig, enforce_eager: bool,
                 tp_size: int) -> None:
        self.model = model
        if config.level is None:
            raise ValueError("compilation_config.level: unset; resolve it for the device first "
                             "(CompilationConfig.resolved)")
        self.level = 0 if enforce_eager else config.level
        self.token_multiple = 1
        """The runner pads every batch to a multiple of this (the TP size under SP)."""
        self.backend: PiecewiseBackend | None = None
        if self.level == 0:
            if enforce_eager and config.pass_config.enable_sequence_parallelism:
                logger.info("enforce_eager: the compile passes (sequence parallelism, async TP) "
                            "are off")
            self.fn = model.forward
            return
        from loom.compilation.pass_manager import PassManager
        inductor_patches(config)  # a bad option name fails here, before any tracing
        passes = self.pass_manager = PassManager(config.pass_config, tp_size)
        forward = model.forward
        hidden_size = getattr(getattr(model, "arch", None), "hidden_size", 0)
        plan = passes.plan(config.compile_sizes, hidden_size)
        if passes.sequence_parallel and not plan.any:
            logger.info("sequence parallelism applies to no graph of this config (%s; "
                        "compile_sizes %s): compiled as without it", plan.reason,
                        list(config.compile_sizes))
        if plan.dynamic:
            self.token_multiple = tp_size
            forward = _flattening(forward)
            unused = [s for s in config.compile_sizes if s % tp_size]
            if unused:
                logger.warning("compile_sizes %s are not multiples of the TP size %d: with "
                               "sequence parallelism batches are padded, so they never run",
                               unused, tp_size)
        if self.level < 3:
            # The pass manager still runs: it turns loom's norm ops back into aten ops.
            self.fn = torch.compile(forward, dynamic=True, fullgraph=True,
                                    options={**inductor_patches(config),
                                             "post_grad_custom_post_pass": passes,
                                             "guard_filter_fn": keep_guards})
        else:
            backend = self.backend = PiecewiseBackend(config, passes)
            self.fn = torch.compile(forward, backend=backend, dynamic=True, fullgraph=True,
                                    options={"guard_filter_fn": keep_guards})
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        # Norm epsilons and attention scales are constants of the model, not inputs.
        torch._dynamo.config.specialize_float = True

    def capture_pieces_at(self, sizes: list[int]) -> bool:
        """Capture the pieces of the general graph at these token counts too (the runner pads
        batches up to them); False where the forward is not split at attention."""
        if self.backend is None or not self.backend.splits_at_attention:
            return False
        self.backend.piece_sizes.update(sizes)
        return True

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        num_tokens = input_ids.shape[0]
        if self.token_multiple > 1:
            # [n / m, m]: the graph's token count is then m * s, a multiple of m by
            # construction, and a sequence-parallel shard of it is exactly s.
            input_ids = input_ids.view(-1, self.token_multiple)
            positions = positions.view(-1, self.token_multiple)
            for t in (input_ids, positions):
                torch._dynamo.mark_static(t, 1)
        if self.level > 0 and input_ids.shape[0] > 1:
            # One graph for every token count, 1 included (`keep_guards`); Dynamo refuses to
            # mark a dimension of size 1 dynamic, so only larger batches are marked.
            torch._dynamo.mark_dynamic(input_ids, 0)
            torch._dynamo.mark_dynamic(positions, 0)
        with _running_size(num_tokens):
            return self.fn(input_ids, positions)


_SIZE = r"(\d+\*)?(L\['\w+'\]|\w+)\.size\(\)\[0\]"
_INT_MAX = r"(2147483647|9223372036854775807)"
_TOKEN_COUNT_GUARDS = (re.compile(rf"2 <= {_SIZE}( <= {_INT_MAX})?"),
                       re.compile(rf"{_SIZE} <= {_INT_MAX}"),
                       re.compile(rf"{_SIZE} == {_SIZE}"))
"""Shape guard terms that say only that the token count is at least 2, the same in every
input, and small enough to index with 32 (or 64) bits: Dynamo's guard code for the
forward's [n] or [n / m, m] inputs (PyTorch 2.11 on CUDA adds the index bounds, as
"4096*L['input_ids'].size()[0] <= 2147483647"). The first compile is the profile run at
the largest batch, so every later batch is within its index bounds."""


def keep_guards(entries: list) -> list[bool]:
    """Dynamo's guard_filter_fn: every guard but a shape guard made only of
    `_TOKEN_COUNT_GUARDS`. Dynamo assumes a dynamic size is never 0 or 1, so the general
    graph's "at least 2" sent a one-token batch (batch-1 decode, its CUDA graph) to a
    second trace and compile of the whole forward: 4.7-7.5 s of an 8B start-up (run_zzz12).
    The graph computes one token as it does two (checked against eager on the CPU, and on
    the GPU), so it serves that batch too: the decode graphs' capture took 0.7 s against
    5.6, batch-1 decode unchanged (run_zzz19). Any other shape guard (a branch on the token
    count) is kept."""
    keep = [not _only_token_count(e) for e in entries]
    kept = [code for e, k in zip(entries, keep)
            if k and e.guard_type == "SHAPE_ENV" and (code := _code(e))]
    if kept:
        logger.info("torch.compile: shape guards %s kept: a one-token batch traces and "
                    "compiles the forward again", kept[0])
    return keep


def _code(entry) -> list[str] | None:
    return getattr(getattr(entry, "orig_guard", None), "code_list", None)


def _only_token_count(entry) -> bool:
    code = _code(entry)
    return entry.guard_type == "SHAPE_ENV" and bool(code) and all(
        any(p.fullmatch(term) for p in _TOKEN_COUNT_GUARDS)
        for line in code for term in line.split(" and "))


def _flattening(forward: Callable) -> Callable:
    """forward over token rows given as [n / m, m] (see `CompiledForward.__call__`)."""
    def flat_forward(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return forward(input_ids.flatten(), positions.flatten())
    return flat_forward
