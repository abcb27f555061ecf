"""The scheduler's side of speculative decoding: which requests get drafts, how many, and
what a verified step leaves computed.

A decode step of a drafting request computes its last token and k draft tokens after it;
the worker verifies the drafts against the model's own choices and returns the accepted
ones plus one more token (the model's at the first rejection, or a bonus one after the
last draft). The KV of rejected drafts is left to be overwritten: num_computed_tokens
steps back over them.

Under async scheduling a request may be scheduled while its last tokens are still in
flight (it runs ahead): its drafts then come from the tokens known on the host, the
n-gram's continuation read as a guess at the tokens in flight and the drafts after them.
A wrong guess costs only rejected drafts: each draft is judged by the model's output at
the position before it, computed from the real tokens. A step that verifies drafts adds
an unknown number of tokens, so nothing runs ahead of it; nor does any other request, so
that the batch is not split into two that alternate (each step reading every weight).
Requests whose sampling reads anything beyond the filtered distribution (penalties, logit
maps, bad words, grammars, pending min_tokens) decode one token at a time, as without
speculation. A seeded request draws each output token from a generator seeded by the
token's index, drafted or not, so its tokens do not depend on the batch.

A draft model (`loom.worker.drafter`) proposes on the worker, behind each step's kernels,
and its drafts are read back with the step's tokens: the scheduler takes those proposals
for the request's next step. They follow its last known token, so a draft model's
requests never run ahead, and each decode allocates `lookahead` KV slots past its tokens,
where the drafter writes its drafts' KV.
"""

from __future__ import annotations

import logging

from loom.core.ngram import NgramProposer
from loom.core.request import Request
from loom.speculative_config import SpeculativeConfig

logger = logging.getLogger(__name__)


class SpecDecoder:
    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        self.k = config.num_speculative_tokens
        self.max_model_len = max_model_len
        self.lookahead = config.lookahead
        self.runs_ahead = config.method == "ngram"
        """Whether a request may be scheduled with its last token in flight (n-gram drafts
        guess at it; a draft model's proposals need it read back)."""
        self.proposer = (NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
                         if config.method == "ngram" else None)
        self._proposed: dict[str, tuple[int, list[int]]] = {}
        """Draft model: request id -> (its token count when proposed, the proposals)."""
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * self.k
        self._totals = [0, 0, 0]
        """(verified steps, draft tokens, accepted tokens) since start, never reset."""
        if self.proposer is not None:
            logger.info("speculative decoding: %s, %d tokens (n-grams of %d..%d); while a "
                        "step verifies drafts, no request runs ahead of it", config.method,
                        self.k, config.prompt_lookup_min, config.prompt_lookup_max)
        else:
            logger.info("speculative decoding: draft model %s, %d tokens; no request runs "
                        "ahead of its step (the next drafts follow its tokens)", config.model,
                        self.k)

    @staticmethod
    def speculates(request: Request) -> bool:
        """Whether the request's decodes are drafted for (its sampling can be verified)."""
        p = request.sampling_params
        return (request.grammar is None and request.pooling_params is None
                and not p.shapes_logits
                and request.num_output_tokens >= p.min_tokens)

    def drafts(self, request: Request, num_new: int, budget: int) -> list[int]:
        """Draft tokens for a request about to compute num_new tokens, if that is a decode
        (its last token, known or still in flight: the n-gram's continuation guesses each
        token in flight, and the drafts follow the guesses), within the step's token
        budget, its max_tokens and max_model_len (every accepted draft and the token after
        must fit)."""
        lag = request.num_output_placeholders  # its last tokens still in flight
        if num_new != 1 or request.num_computed_tokens != request.num_tokens - 1 + lag:
            return []  # a prompt chunk
        room = min(self.k, budget - 1, self.max_model_len - request.num_tokens - lag - 1)
        if request.max_tokens is not None:
            room = min(room, request.max_tokens - request.num_output_tokens - lag - 1)
        if room <= 0 or not self.speculates(request):
            return []
        if self.proposer is None:  # a draft model's, made after the request's last token
            num_tokens, proposals = self._proposed.get(request.request_id, (-1, []))
            return proposals[:room] if num_tokens == request.num_tokens and not lag else []
        return self.proposer.propose(request.request_id, request.all_token_ids, room + lag)[lag:]

    def lookahead_slots(self, request: Request, end: int) -> int:
        """KV slots past a step's tokens (which end at `end`) for a draft model's drafts,
        where the step samples: its drafter writes their KV there (none past
        max_model_len)."""
        if not self.lookahead or end < request.num_tokens:
            return 0
        return min(self.lookahead, max(0, self.max_model_len - end))

    def waits_for_step(self, running: list[Request]) -> bool:
        """Whether nothing may be scheduled now: a draft model proposes once a step is read
        back, so the next step waits for it whole rather than split off the requests that
        are ready into a batch of their own."""
        return not self.runs_ahead and any(r.num_output_placeholders for r in running)

    def proposed(self, request: Request, token_ids: list[int]) -> None:
        """A draft model's proposals after the request's known tokens (its step read back)."""
        self._proposed[request.request_id] = (request.num_tokens, token_ids)

    def on_output(self, request: Request, drafted: int, sampled: list[int]) -> None:
        """A step that verified `drafted` drafts came back: count it, and step
        num_computed_tokens back over the rejected drafts (their KV is overwritten later)."""
        request.spec_token_ids = []
        accepted = max(0, len(sampled) - 1)
        request.num_computed_tokens -= drafted - accepted
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        for i, n in enumerate((1, drafted, accepted)):
            self._totals[i] += n
        for i in range(accepted):
            self.accepted_per_pos[i] += 1

    def totals(self) -> tuple[int, int, int]:
        """(verified steps, draft tokens, accepted tokens) since start (benchmarks)."""
        return tuple(self._totals)

    def drop(self, request_id: str) -> None:
        self._proposed.pop(request_id, None)
        if self.proposer is not None:
            self.proposer.drop(request_id)

    def take_stats(self) -> dict:
        """Counters since the last call, as SchedulerStats' spec_* fields."""
        stats = dict(spec_num_drafts=self.num_drafts, spec_num_draft_tokens=self.num_draft_tokens,
                     spec_num_accepted_tokens=self.num_accepted_tokens,
                     spec_accepted_per_pos=list(self.accepted_per_pos) if self.num_drafts else [])
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * self.k
        return stats
