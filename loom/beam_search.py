"""Beam search as vLLM runs it, on top of generation: each round asks every live beam for one
token with its top 2 x beam_width logprobs, extends each beam by each of them, and keeps the
beam_width best (a beam ending in EOS is set aside as complete). After max_tokens rounds the
complete and live beams are ranked together by cum_logprob / length ** length_penalty, the
length counting the prompt (and not a final EOS), as vLLM ranks them.

The rounds re-send whole sequences; the prefix cache serves all but their last block. Torch
free: the offline `LLM.beam_search` and the server drive it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from loom.config_checks import check_bools
from loom.outputs import CompletionOutput, PositionLogprobs, RequestOutput
from loom.sampling_params import SamplingParams


@dataclass(frozen=True)
class BeamSearchParams:
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        check_bools({"ignore_eos": self.ignore_eos,
                     "include_stop_str_in_output": self.include_stop_str_in_output})
        for name in ("temperature", "length_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or \
                    not math.isfinite(value):
                raise ValueError(f"{name}: must be a finite number, got {value!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature: must be non-negative, got {self.temperature}")


@dataclass
class BeamSearchSequence:
    tokens: list[int]
    """The prompt's tokens, then the beam's."""
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    """The generated text, set on the sequences returned."""
    finish_reason: str | None = None


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]
    """The beam_width best, best first."""


def check_width(params: BeamSearchParams, max_logprobs: int, field: str,
                logprobs_mode: str = "raw_logprobs") -> None:
    """A round asks for 2 x beam_width logprobs: beyond the engine's max_logprobs, say so
    in the beam search's own terms (vLLM has the same bound); an engine reporting logits
    instead (--logprobs-mode) cannot rank beams."""
    if logprobs_mode.endswith("logits"):
        raise ValueError(f"{field}: beam search ranks beams by their logprobs, and this "
                         f"engine reports logits (--logprobs-mode {logprobs_mode})")
    if 2 * params.beam_width > max_logprobs:
        raise ValueError(f"{field}: a beam width of {params.beam_width} asks for "
                         f"{2 * params.beam_width} logprobs a round, more than max_logprobs "
                         f"({max_logprobs}); raise it (--max-logprobs, LLM(max_logprobs=...))")


class BeamSearch:
    """One prompt's search; `prompts()` are the next round's requests, `advance` takes their
    one-token outputs in the same order."""

    def __init__(self, prompt_ids: list[int], params: BeamSearchParams,
                 eos_token_id: int | None) -> None:
        self.prompt_len = len(prompt_ids)
        self.params = params
        self.eos = None if params.ignore_eos else eos_token_id
        self.beams = [BeamSearchSequence(list(prompt_ids))]
        self.completed: list[BeamSearchSequence] = []
        self.rounds = 0

    @property
    def done(self) -> bool:
        return self.rounds >= self.params.max_tokens or not self.beams

    def round_params(self) -> SamplingParams:
        return SamplingParams(max_tokens=1, logprobs=2 * self.params.beam_width,
                              temperature=self.params.temperature, ignore_eos=True)

    def prompts(self) -> list[list[int]]:
        return [beam.tokens for beam in self.beams]

    def advance(self, outputs: list[CompletionOutput]) -> None:
        candidates = []
        for beam, out in zip(self.beams, outputs):
            position = out.logprobs[0]
            for token, logprob in position.items():
                new = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [position],
                                         beam.cum_logprob + logprob.logprob)
                (self.completed if token == self.eos else candidates).append(new)
        self.beams = sorted(candidates, key=self._score, reverse=True)[:self.params.beam_width]
        self.rounds += 1

    def best(self, decode) -> list[BeamSearchSequence]:
        """The beam_width best of all beams, each with its text (decode: ids -> str)."""
        ranked = sorted(self.completed + self.beams, key=self._score, reverse=True)
        best = ranked[:self.params.beam_width]
        for beam in best:
            generated = beam.tokens[self.prompt_len:]
            ended = bool(generated) and generated[-1] == self.eos
            beam.finish_reason = "stop" if ended else "length"
            if ended and not self.params.include_stop_str_in_output:
                generated = generated[:-1]
            beam.text = decode(generated)
        return best

    def _score(self, beam: BeamSearchSequence) -> float:
        length = len(beam.tokens) - (1 if self.eos is not None and beam.tokens[-1] == self.eos
                                     else 0)
        return beam.cum_logprob / (length ** self.params.length_penalty)


async def beam_search_async(generate: Callable[[list[int], SamplingParams, str],
                                               AsyncIterator[RequestOutput]],
                            prompt_ids: list[int], params: BeamSearchParams,
                            eos_token_id: int | None, request_id: str,
                            decode: Callable[[list[int]], str]) -> list[BeamSearchSequence]:
    """The server's search over an AsyncLLM's generate: each round's beams run at once."""
    search = BeamSearch(prompt_ids, params, eos_token_id)
    while not search.done:
        rounds = [_one_token(generate(ids, search.round_params(),
                                      f"{request_id}-beam{search.rounds}-{k}"))
                  for k, ids in enumerate(search.prompts())]
        search.advance(await asyncio.gather(*rounds))  # a failure cancels the caller
    return search.best(decode)


async def _one_token(outputs: AsyncIterator[RequestOutput]) -> CompletionOutput:
    """The one-token request's output that carries the token and its logprobs."""
    found = None
    async with aclosing(outputs):  # cancelled, the request is aborted in the engine
        async for output in outputs:
            for delta in output.outputs:
                if delta.logprobs:
                    found = delta
    if found is None:
        raise RuntimeError("beam search: a round's request returned no token")
    return found
