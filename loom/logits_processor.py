"""Custom logits processors: vLLM's batch-level interface (`vllm.v1.sample.logits_processor`),
so that a processor written for vLLM runs here with its imports changed to this module.

A processor sees the whole batch at once. Each step the engine first calls `update_state`
with what changed in the batch since the last step (a `BatchUpdate`, or None), then `apply`
with the step's logits, one row per request in the order its updates describe. A request
opts in through its own `SamplingParams.extra_args` (`vllm_xargs` in an HTTP request).

Loaded at start-up from `LLM(logits_processors=[...])` / `--logits-processors` (classes, or
"module.path:ClassName" names) and from the installed packages' `loom.logits_processors`
entry points; a request's params are checked by each class's `validate_params` before the
request is accepted.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum, auto
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from loom.sampling_params import SamplingParams

if TYPE_CHECKING:  # the API server checks requests with these classes without torch
    import torch

    from loom.config import EngineConfig

ENTRY_POINT_GROUP = "loom.logits_processors"


class MoveDirectionality(Enum):
    UNIDIRECTIONAL = auto()
    """The request at the first index moves to the second; the first is left empty."""
    SWAP = auto()
    """The requests at the two indices trade places."""


AddedRequest = tuple[int, SamplingParams, Sequence[int], Sequence[int]]
"""(index, params, prompt token ids, output token ids). The output ids are a live view:
they grow as the request generates."""
MovedRequest = tuple[int, int, MoveDirectionality]
RemovedRequest = int


@dataclass(frozen=True)
class BatchUpdate:
    """The batch's changes since the last step, to be applied in this order: removed, added
    (an add at an occupied index replaces its request), moved."""
    batch_size: int
    removed: Sequence[RemovedRequest]
    added: Sequence[AddedRequest]
    moved: Sequence[MovedRequest]


class LogitsProcessor(ABC):
    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Raise ValueError for params this processor cannot take: the request is refused
        (a 400 over HTTP) before it reaches the engine."""

    @abstractmethod
    def __init__(self, vllm_config: EngineConfig, device: torch.device,
                 is_pin_memory: bool) -> None:
        """vllm_config: loom's EngineConfig (`.model`, `.cache`, `.scheduler`, ...)."""

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """[batch, vocab] logits in, the processed ones out (in place or new)."""

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True if it never changes a row's most likely token: it is then applied after
        temperature, to random rows' distributions only, and skipped when every request in
        the step is greedy. Asked once, at start-up."""

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Called before every `apply`; None when the batch is as it was."""


RequestLogitsProcessor = Callable[..., "torch.Tensor"]
"""A per-request function (output_ids, logits_row) -> logits_row, or
(prompt_ids, output_ids, logits_row) -> logits_row."""


class AdapterLogitsProcessor(LogitsProcessor):
    """Runs per-request functions as a batch-level processor: subclass it and define
    `new_req_logits_processor(params)` (a function for the request, or None to leave its
    row alone) and `is_argmax_invariant`."""

    def __init__(self, vllm_config: EngineConfig, device: torch.device,
                 is_pin_memory: bool) -> None:
        self.req_info: dict[int, tuple[RequestLogitsProcessor, bool, Sequence[int],
                                       Sequence[int]]] = {}

    @abstractmethod
    def new_req_logits_processor(self, params: SamplingParams) -> RequestLogitsProcessor | None:
        """The function for a request newly in the batch, or None."""

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.req_info.pop(index, None)
        for index, params, prompt_ids, output_ids in batch_update.added:
            fn = self.new_req_logits_processor(params)
            if fn is None:
                self.req_info.pop(index, None)
            else:
                self.req_info[index] = (fn, _takes_prompt(fn), prompt_ids, output_ids)
        for a, b, direction in batch_update.moved:
            info_a, info_b = self.req_info.pop(a, None), self.req_info.pop(b, None)
            if info_a is not None:
                self.req_info[b] = info_a
            if direction is MoveDirectionality.SWAP and info_b is not None:
                self.req_info[a] = info_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (fn, with_prompt, prompt_ids, output_ids) in self.req_info.items():
            args = (prompt_ids, output_ids) if with_prompt else (output_ids,)
            logits[index] = fn(*args, logits[index])
        return logits


def _takes_prompt(fn: Callable) -> bool:
    import inspect
    try:
        return len(inspect.signature(fn).parameters) == 3
    except (TypeError, ValueError):
        return False


def load_classes(specs: Sequence[str | type] = ()) -> list[type[LogitsProcessor]]:
    """The classes `specs` name ("module.path:ClassName", or "module.path.ClassName"),
    then those of the `loom.logits_processors` entry points. Raises ValueError naming a spec
    that does not import or is not a LogitsProcessor subclass."""
    found = [_resolve(spec) for spec in specs]
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        found.append(_resolve(entry.value, f"entry point {entry.name!r} ({ENTRY_POINT_GROUP})"))
    unique: list[type[LogitsProcessor]] = []
    for cls in found:
        if cls not in unique:
            unique.append(cls)
    return unique


def check_picklable(specs: Sequence[str | type]) -> None:
    """Class objects that must reach other processes (TP workers) go pickled, by reference:
    a ValueError names one that cannot (defined inside a function, say)."""
    import pickle
    for spec in specs:
        if isinstance(spec, str):
            continue
        try:
            pickle.dumps(spec)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise ValueError(f"logits_processors: {spec.__qualname__} cannot reach the tensor "
                             f"parallel workers ({e}); define it at a module's top level, or "
                             "give it as module.path:ClassName") from None


def _resolve(spec: Any, where: str | None = None) -> type[LogitsProcessor]:
    where = where or f"logits_processors: {spec!r}"
    cls = spec
    if isinstance(spec, str):
        module, sep, name = spec.partition(":") if ":" in spec else spec.rpartition(".")
        if not module or not name or not sep:
            raise ValueError(f"{where}: expected module.path:ClassName")
        try:
            cls = importlib.import_module(module)
            for part in name.split("."):
                cls = getattr(cls, part)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"{where}: cannot import it: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, LogitsProcessor)):
        raise ValueError(f"{where}: not a subclass of loom.logits_processor.LogitsProcessor")
    return cls

