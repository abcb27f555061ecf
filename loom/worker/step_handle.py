"""A launched step whose results are read back later: the device runs it meanwhile.

`ModelRunner.launch` queues a step and returns a `StepHandle`; `output()` waits for that
step's sampled tokens (copied into pinned host memory behind the step on the stream), records
them in the runner's request tables and builds the `ModelRunnerOutput`. Under async
scheduling the engine launches step N+1 before it asks for step N's output, so the host
work of one step overlaps the device work of the other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from loom.core.sched_output import ModelRunnerOutput
from loom.engine.protocol import Logprobs
from loom.pinned import PinnedRing
from loom.worker.spec_verify import logprob_lists

logger = logging.getLogger(__name__)


class StepHandle:
    def __init__(self, runner, reqs: list, positions: list[int], sample_rows: list[int]) -> None:
        """positions: per request, where its first sampled token goes (its seq_len, less
        its drafts under speculative decoding)."""
        self._runner, self._reqs, self._positions, self._rows = runner, reqs, positions, sample_rows
        self._tokens: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None
        self._output: ModelRunnerOutput | None = None
        self._sampled: tuple[list[list[int]], dict[str, list[int]]] | None = None
        self.logprobs: Callable[[], list[Logprobs]] | None = None
        self.draft_logprobs: Callable[[], list[Logprobs | None]] | None = None
        """Speculative decoding: each draft row's logprobs (`spec_verify.verify_step`)."""
        self.draft_counts = None
        """Speculative decoding: drafts per sampling request."""
        self.pooled: dict[str, list[float]] = {}
        self.prompt_logprobs: dict[str, list[Logprobs]] = {}
        self.layer_clock = None
        """LOOM_LAYER_TIMES: the step's per-layer clock, reported once it has run."""
        self.lora_errors: dict[int, str] = {}
        self._draft_width = 0
        """A draft model's: the drafts read back beside each row's tokens (`read_back`)."""

    @classmethod
    def done(cls, output: ModelRunnerOutput) -> StepHandle:
        handle = cls(None, [], [], [])
        handle._output = output
        return handle

    def read_back(self, tokens: torch.Tensor, drafts: torch.Tensor | None = None) -> None:
        """Start copying the sampled tokens to the host behind the step's kernels: [R], or
        [R, K + 1] under speculative decoding (each row's tokens, then -1s); a draft
        model's drafts for each row's next step ([R, k], -1 past them) in the same copy."""
        if drafts is not None:
            tokens = torch.cat([tokens.reshape(len(drafts), -1), drafts], dim=1)
            self._draft_width = drafts.shape[1]
        if tokens.device.type != "cuda":
            self._tokens = tokens
            return
        self._tokens = _READBACK.take(tokens.numel()).view(tokens.shape)
        self._tokens.copy_(tokens, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def output(self) -> ModelRunnerOutput:
        if self._output is None:
            self._output = self._finish()
        return self._output

    def sampled(self) -> tuple[list[list[int]], dict[str, list[int]]]:
        """Each request's sampled tokens ([] where it sampled none) and a draft model's
        drafts, read back once (waiting for this step only, not for steps queued after it)
        and recorded in the runner's request tables. Besides `output`, the runner reads a
        step back early for requests that ran ahead of it (`SampledSteps.catch_up`)."""
        if self._sampled is not None:
            return self._sampled
        if self._event is not None:
            self._event.synchronize()
        tokens = self._tokens.tolist() if self._tokens is not None else []
        states, reqs = self._runner.requests, self._reqs
        drafts = {}
        if self._draft_width:  # each row: its tokens, then its drafts
            width = self._draft_width
            drafts = {reqs[i].req_id: [t for t in row[-width:] if t >= 0]
                      for i, row in zip(self._rows, tokens) if row[-width] >= 0}
            tokens = [row[:-width] for row in tokens]
        sampled: list[list[int]] = [[] for _ in reqs]
        for i, token in zip(self._rows, tokens):
            sampled[i] = [t for t in token if t >= 0] if isinstance(token, list) else [token]
            states.append_sampled(reqs[i], self._positions[i], sampled[i])
        self._sampled = sampled, drafts
        return self._sampled

    def _finish(self) -> ModelRunnerOutput:
        sampled, drafts = self.sampled()
        if self.layer_clock is not None:
            line = self.layer_clock.report()
            if line:
                logger.info("%s", line)
        reqs = self._reqs
        logprobs: list[Logprobs | None] = [None] * len(reqs)
        if self.logprobs is not None:
            for i, struct in zip(self._rows, self.logprobs()):
                logprobs[i] = struct
        if not self._runner.is_driver:
            return ModelRunnerOutput()
        per_token = {}
        if self.draft_logprobs is not None:
            per_token = {reqs[i].req_id: lps for i, lps in logprob_lists(
                self.draft_logprobs(), self.draft_counts, self._rows, sampled, logprobs).items()}
        return ModelRunnerOutput(req_ids=[r.req_id for r in reqs], sampled_token_ids=sampled,
                                 logprobs=logprobs, prompt_logprobs=self.prompt_logprobs,
                                 pooled=self.pooled, spec_logprobs=per_token,
                                 draft_token_ids=drafts, lora_errors=self.lora_errors)


_READBACK = PinnedRing(4, torch.int64)
"""Sampled tokens' buffers: steps are read back in launch order with at most three launched
and unread, so a buffer is free again four steps on (no event needed)."""
