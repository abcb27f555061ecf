"""The driver rank's custom logits processors (`loom.logits_processor`) and the batch they see.

loom has no persistent batch: each step's sampling rows are in the scheduler's order. The
processors are shown vLLM's persistent-batch model instead: a request keeps its index while
it samples step after step; new requests fill the indices of those that left (lowest first),
then extend the batch; indices left empty are filled by moving the last request down. The
step's logits are gathered into that order for `apply` and scattered back, which costs one
[batch, vocab] copy each way, and only when some processor is loaded.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from loom.logits_processor import BatchUpdate, MoveDirectionality, load_classes

if TYPE_CHECKING:
    from loom.config import EngineConfig
    from loom.worker.input_batch import CachedRequestState

logger = logging.getLogger(__name__)


class OutputIds(Sequence):
    """A request's output token ids as they grow (the tokens read back so far)."""

    def __init__(self, state: CachedRequestState) -> None:
        self._state = state

    def __len__(self) -> int:
        return len(self._state.token_ids) - self._state.num_prompt_tokens

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._state.output_token_ids[i]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("output token index out of range")
        return self._state.token_ids[self._state.num_prompt_tokens + (i % n)]

    def __repr__(self) -> str:
        return f"OutputIds({self._state.output_token_ids!r})"


class StepProcessors:
    """The processors, ready for one step's logits (rows in the step's sampling order)."""

    def __init__(self, owner: CustomProcessors, order: torch.Tensor | None) -> None:
        self._owner = owner
        self._order = order
        """The step's logits row of each batch index; None when they are the same."""

    @property
    def has_invariant(self) -> bool:
        return bool(self._owner.invariant)

    def apply(self, logits: torch.Tensor, argmax_invariant: bool) -> torch.Tensor:
        procs = self._owner.invariant if argmax_invariant else self._owner.variant
        if not procs:
            return logits
        batch = logits if self._order is None else logits.index_select(0, self._order)
        for proc in procs:
            batch = proc.apply(batch)
        if self._order is None:
            return batch
        return logits.index_copy_(0, self._order, batch.to(logits.dtype))


class CustomProcessors:
    def __init__(self, classes: list[type], config: EngineConfig, device: torch.device) -> None:
        procs = [cls(config, device, device.type == "cuda") for cls in classes]
        self.variant = [p for p in procs if not p.is_argmax_invariant()]
        self.invariant = [p for p in procs if p.is_argmax_invariant()]
        self.device = device
        self.slots: list[str] = []
        """The request at each batch index, as the processors last saw it."""
        logger.info("custom logits processors: %s",
                    ", ".join(type(p).__qualname__ for p in procs))

    @classmethod
    def make(cls, config: EngineConfig, device: torch.device,
             is_driver: bool) -> CustomProcessors | None:
        """The driver's processors (only the driver samples); None when there are none."""
        classes = load_classes(config.model.logits_processors) if is_driver else []
        if classes and config.speculative is not None:  # entry points' too (config can't)
            raise ValueError("logits_processors: not supported with speculative decoding "
                             f"(as in vLLM); loaded: {[c.__name__ for c in classes]}")
        return cls(classes, config, device) if classes else None

    def step(self, reqs: list[CachedRequestState]) -> StepProcessors:
        """Tell every processor how the batch changed to become `reqs` (this step's sampling
        requests, in logits row order)."""
        update = self._update(reqs)
        for proc in self.variant + self.invariant:
            proc.update_state(update)
        row_of = {r.req_id: i for i, r in enumerate(reqs)}
        order = [row_of[req_id] for req_id in self.slots]
        if order == list(range(len(order))):
            return StepProcessors(self, None)
        return StepProcessors(self, torch.tensor(order, dtype=torch.long).to(self.device))

    def _update(self, reqs: list[CachedRequestState]) -> BatchUpdate | None:
        here = {r.req_id for r in reqs}
        slots: list[str | None] = list(self.slots)
        known = set(self.slots)
        left = [i for i, req_id in enumerate(slots) if req_id not in here]
        fresh = [r for r in reqs if r.req_id not in known]
        added = []
        for j, r in enumerate(fresh):
            index = left[j] if j < len(left) else len(slots)
            if index == len(slots):
                slots.append(r.req_id)
            else:
                slots[index] = r.req_id
            added.append((index, r.params, r.token_ids[:r.num_prompt_tokens], OutputIds(r)))
        removed = left[len(fresh):]
        moved = []
        for hole in removed:
            slots[hole] = None
        for hole in removed:
            while slots and slots[-1] is None:
                slots.pop()
            if hole < len(slots):
                moved.append((len(slots) - 1, hole, MoveDirectionality.UNIDIRECTIONAL))
                slots[hole] = slots.pop()
        while slots and slots[-1] is None:
            slots.pop()
        self.slots = slots
        if not (added or removed or moved):
            return None
        return BatchUpdate(len(slots), removed, added, moved)
