"""Pooling: an embedding request's prompt rows -> one vector, across prefill chunks.

The final-norm hidden states of a pooling request's rows are folded into a per-request
partial kept on the device (the first row for cls, a running sum for mean); when the
request's prompt is complete the partial becomes the pooled vector, which is the only thing
copied to the host. A classify or score request's vector is the classifier head's logits
at its last row (the engine core has cut the prompt after its last non-pad token).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from loom.models.st_dense import project
from loom.pooling_params import PoolingParams


class Pooler:
    def __init__(self, head: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 head_row: int | str = -1, projection: list | None = None) -> None:
        """head: a classifier's (hidden -> logits); None for models without one. head_row:
        the prompt row it reads (a decoder's last; an encoder's first, its [CLS] / <s>), or
        "mean": the mean of the rows (an encoder's whole prompt, one chunk). projection:
        the sentence-transformers Dense modules an embedding passes before it is normalised
        (`loom.models.st_dense`)."""
        self._projection = projection or []
        self._head = head
        self._head_row = head_row
        self._partial: dict[str, torch.Tensor] = {}

    def drop(self, req_ids: list[str]) -> None:
        """Forget finished, aborted or preempted requests (a preempted one restarts at 0)."""
        for req_id in req_ids:
            self._partial.pop(req_id, None)

    def fold(self, req_id: str, params: PoolingParams, rows: torch.Tensor, first_position: int,
             num_prompt_tokens: int) -> torch.Tensor | None:
        """Fold one chunk of the request's rows (starting at prompt position first_position);
        returns the pooled vector once the chunk reaches the end of the prompt."""
        complete = first_position + rows.shape[0] >= num_prompt_tokens
        if params.task != "embed":  # the engine core refuses it where there is no head
            if not complete:
                return None
            return self._head(rows.float().mean(dim=0) if self._head_row == "mean"
                              else rows[self._head_row])
        kind = params.pooling_type
        if kind == "cls" and first_position == 0:
            self._partial[req_id] = rows[0].to(torch.float32, copy=True)
        elif kind == "mean":
            chunk_sum = rows.float().sum(dim=0)
            previous = self._partial.get(req_id) if first_position > 0 else None
            self._partial[req_id] = chunk_sum if previous is None else previous + chunk_sum
        if not complete:
            return None
        if kind == "last":
            pooled = rows[-1].float()
        elif kind == "mean":
            pooled = self._partial.pop(req_id) / num_prompt_tokens
        else:
            pooled = self._partial.pop(req_id)
        if self._projection:
            pooled = project(pooled, self._projection)
        if params.dimensions is not None:  # a matryoshka model's leading values
            pooled = pooled[:params.dimensions]
        return F.normalize(pooled, dim=-1) if params.normalize else pooled
