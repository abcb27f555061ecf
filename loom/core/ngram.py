"""N-gram prompt lookup: draft tokens for speculative decoding from a request's own text.

The last n tokens are looked up earlier in the request's prompt and output (n from
prompt_lookup_max down to prompt_lookup_min, the longest that matches wins; its first
occurrence, as vLLM's); the tokens that followed it are the draft. Runs on the host in the
engine core, between steps: numpy over a per-request copy of the tokens, grown as they
arrive, so that a step costs one comparison pass per request rather than a list copy.
"""

from __future__ import annotations

import numpy as np


class NgramProposer:
    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self._tokens: dict[str, tuple[np.ndarray, int]] = {}
        """Request id -> (buffer, tokens in it) mirroring the request's token ids."""

    def propose(self, request_id: str, token_ids: list[int], k: int) -> list[int]:
        """Up to k draft tokens to follow token_ids (fewer, or none, where the context has
        no match or the match is near its end)."""
        if k <= 0:
            return []
        tokens = self._synced(request_id, token_ids)
        return find_draft(tokens, self.min_n, self.max_n, k)

    def drop(self, request_id: str) -> None:
        self._tokens.pop(request_id, None)

    def _synced(self, request_id: str, token_ids: list[int]) -> np.ndarray:
        buf, n = self._tokens.get(request_id, (None, 0))
        if buf is None or len(token_ids) > len(buf):
            grown = np.empty(max(2 * len(token_ids), 64), dtype=np.int64)
            if n:
                grown[:n] = buf[:n]
            buf = grown
        if len(token_ids) < n:  # never expected (tokens only grow); start over
            n = 0
        buf[n:len(token_ids)] = token_ids[n:]
        self._tokens[request_id] = (buf, len(token_ids))
        return buf[:len(token_ids)]


def find_draft(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """The k tokens after the first earlier occurrence of the longest suffix n-gram."""
    length = len(tokens)
    # Where an earlier window could end: the last token's value, before the last position.
    ends = np.flatnonzero(tokens[:length - 1] == tokens[length - 1])
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        matched = ends[ends >= n - 1]
        for back in range(1, n):  # narrow by one more token of the n-gram each time
            if not matched.size:
                break
            matched = matched[tokens[matched - back] == tokens[length - 1 - back]]
        if matched.size:
            start = int(matched[0]) + 1
            return tokens[start:start + k].tolist()
    return []
