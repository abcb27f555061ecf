"""Custom logits processors for the tests, written against loom.logits_processor's interface
as a vLLM user writes them against vLLM's; importable by name (--logits-processors)."""

from __future__ import annotations

import torch

from loom.logits_processor import (AdapterLogitsProcessor, BatchUpdate, LogitsProcessor,
                                   MoveDirectionality)

CALLS: list[tuple[str, str, int]] = []
"""(class, "update" or "apply", batch size) of every call in this process."""


class _ByIndex(LogitsProcessor):
    """Keeps one value per batch index, taken from each added request's extra_args[key]."""
    key = ""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.values: dict[int, object] = {}
        self.size = 0

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        CALLS.append((type(self).__name__, "update", self.size))
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.values.pop(index, None)
        for index, params, _, _ in batch_update.added:
            value = (params.extra_args or {}).get(self.key)
            if value is None:
                self.values.pop(index, None)
            else:
                self.values[index] = value
        for a, b, direction in batch_update.moved:
            at_a, at_b = self.values.pop(a, None), self.values.pop(b, None)
            if at_a is not None:
                self.values[b] = at_a
            if direction is MoveDirectionality.SWAP and at_b is not None:
                self.values[a] = at_b
        self.size = batch_update.batch_size
        assert all(i < self.size for i in self.values), (self.values, self.size)


class TargetToken(_ByIndex):
    """extra_args {"target_token": id}: that token is the only one the request can draw."""
    key = "target_token"

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        value = (sampling_params.extra_args or {}).get(cls.key)
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ValueError(f"target_token: must be a token id, got {value!r}")

    def is_argmax_invariant(self) -> bool:
        return False

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        CALLS.append((type(self).__name__, "apply", logits.shape[0]))
        assert logits.shape[0] == self.size
        for index, token in self.values.items():
            keep = logits[index, token].item()
            logits[index] = float("-inf")
            logits[index, token] = keep
        return logits


class TopOne(_ByIndex):
    """extra_args {"top_one": true}: only the row's most likely token stays (after
    temperature), so a random request draws what a greedy one would."""
    key = "top_one"

    def is_argmax_invariant(self) -> bool:
        return True

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        CALLS.append((type(self).__name__, "apply", logits.shape[0]))
        for index in self.values:
            row = logits[index]
            logits[index] = torch.where(row == row.max(), row, float("-inf"))
        return logits


class CountUp(AdapterLogitsProcessor):
    """extra_args {"count_from": t}: the request's k-th token is t + k, read off its own
    output so far; {"after_prompt": true}: its k-th is its last prompt token + 1 + k;
    {"follow": true}: after its first (free) token, each is its last output token + 1."""

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params):
        args = params.extra_args or {}
        if "count_from" in args:
            start = args["count_from"]

            def from_outputs(output_ids, row):
                return _only(row, start + len(output_ids))
            return from_outputs
        if args.get("after_prompt"):
            def from_prompt(prompt_ids, output_ids, row):
                return _only(row, prompt_ids[-1] + 1 + len(output_ids))
            return from_prompt
        if args.get("follow"):
            def follow(output_ids, row):
                return _only(row, output_ids[-1] + 1) if output_ids else row
            return follow
        return None


def _only(row: torch.Tensor, token: int) -> torch.Tensor:
    out = torch.full_like(row, float("-inf"))
    out[token % row.shape[0]] = 0.0
    return out


class NotAProcessor:
    pass
