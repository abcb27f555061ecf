"""Engine outputs -> user outputs: detokenize, apply stop strings, gather n > 1.

Shared by the offline `LLM` and the server's `AsyncLLM`. A request with `n > 1` is sent to
the engine as n child requests; their outputs are gathered under the parent's id here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from loom.engine.protocol import EngineCoreOutput, FinishReason, Logprobs
from loom.frontend.detokenizer import IncrementalDetokenizer
from loom.frontend.tokenizer import Tokenizer
from loom.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput
from loom.sampling_params import SamplingParams


class OutputKind(enum.Enum):
    FINAL_ONLY = 0
    """One RequestOutput per request, when every completion has finished (offline)."""
    DELTA = 1
    """A RequestOutput per step carrying only what is new (streaming)."""


@dataclass
class ParentRequest:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    n: int
    kind: OutputKind
    children: dict[int, CompletionOutput] = field(default_factory=dict)
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return len(self.children) == self.n and all(c.finished for c in self.children.values())


class ChildState:
    """One engine request: its tokens, text and logprobs so far."""

    def __init__(self, parent: ParentRequest, index: int, params: SamplingParams,
                 tokenizer: Tokenizer | None) -> None:
        self.parent, self.index, self.params = parent, index, params
        self.tokenizer = tokenizer
        self.detok = (IncrementalDetokenizer(tokenizer, parent.prompt_token_ids,
                                             params.skip_special_tokens, params.stop,
                                             params.include_stop_str_in_output,
                                             params.min_tokens)
                      if tokenizer is not None else None)
        self.output = CompletionOutput(index, "", [], 0.0 if params.logprobs is not None else None,
                                       [] if params.logprobs is not None else None)
        self.sent_tokens = 0
        self.sent_logprobs = 0

    def update(self, out: EngineCoreOutput) -> bool:
        """Fold in one engine output; True if a stop string ended a request the engine
        still runs (so it must be aborted there)."""
        stop_str = None
        self.output.token_ids.extend(out.new_token_ids)
        if out.new_logprobs and self.output.logprobs is not None:
            for lp in out.new_logprobs:
                self.output.logprobs.append(convert_logprobs(lp, self.tokenizer))
                self.output.cumulative_logprob += lp.logprobs[0]
        if self.detok is not None:
            stop_str = self.detok.update(self._text_token_ids(out))
            if stop_str is None and out.finish_reason is not None:
                stop_str = self.detok.flush()  # the end may complete a held-back character
            self.output.text = self.detok.output_text
        if stop_str is not None:
            self.output.finish_reason, self.output.stop_reason = "stop", stop_str
        elif out.finish_reason is not None:
            self.output.finish_reason = str(out.finish_reason)
            self.output.stop_reason, self.output.error = out.stop_reason, out.error
        return stop_str is not None and out.finish_reason is None

    def _text_token_ids(self, out: EngineCoreOutput) -> list[int]:
        """The new tokens whose text the output shows: as vLLM, not the token that stopped
        the request (EOS, generation_config's other EOS ids, a stop_token_ids entry) unless
        include_stop_str_in_output; its id stays in token_ids."""
        ids = out.new_token_ids
        if (out.finish_reason != FinishReason.STOP or not ids
                or self.params.include_stop_str_in_output):
            return ids
        last = ids[-1]
        stop_ids = set(self.params.stop_token_ids)
        if not self.params.ignore_eos:
            stop_ids |= self.tokenizer.eos_token_ids
        return ids[:-1] if last in stop_ids else ids

    def delta(self) -> CompletionOutput:
        """What is new since the last delta (text held back while it may start a stop string)."""
        text = ("" if self.detok is None
                else self.detok.get_next_delta_text(finished=self.output.finished))
        tokens = self.output.token_ids[self.sent_tokens:]
        logprobs = (self.output.logprobs[self.sent_logprobs:]
                    if self.output.logprobs is not None else None)
        self.sent_tokens = len(self.output.token_ids)
        self.sent_logprobs = len(self.output.logprobs or [])
        return CompletionOutput(self.index, text, tokens, self.output.cumulative_logprob, logprobs,
                                self.output.finish_reason, self.output.stop_reason)


def convert_logprobs(lp: Logprobs, tokenizer: Tokenizer | None) -> PositionLogprobs:
    out: PositionLogprobs = {}
    for k, (token, value) in enumerate(zip(lp.token_ids, lp.logprobs)):
        if token in out:
            continue  # the chosen token can also be among the top-N
        text = tokenizer.decode([token], skip_special_tokens=False) if tokenizer else None
        rank = lp.rank if k == 0 else k
        out[token] = Logprob(value, rank, text)
    return out


def child_request_id(parent_id: str, index: int, n: int) -> str:
    return parent_id if n == 1 else f"{index}_{parent_id}"


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self.children: dict[str, ChildState] = {}

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, kind: OutputKind) -> list[tuple[str, SamplingParams]]:
        """Register a request; returns the (engine request id, params) of each child."""
        if params.stop and self.tokenizer is None:
            raise ValueError("stop: stop strings need a tokenizer")
        parent = ParentRequest(request_id, prompt, prompt_token_ids, params.n, kind)
        children = []
        for i in range(params.n):
            seed = None if params.seed is None else params.seed + i
            child_params = params.clone(n=1, seed=seed) if params.n > 1 else params
            child_id = child_request_id(request_id, i, params.n)
            self.children[child_id] = ChildState(parent, i, child_params, self.tokenizer)
            parent.children[i] = self.children[child_id].output
            children.append((child_id, child_params))
        return children

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        """Returns the user outputs ready now and the engine requests to abort (stop strings)."""
        ready: dict[str, RequestOutput] = {}
        to_abort: list[str] = []
        for out in outputs:
            child = self.children.get(out.request_id)
            if child is None:
                continue  # aborted by the user after the engine produced this
            if child.update(out):
                to_abort.append(out.request_id)
            self._fold_prompt_logprobs(child.parent, out)
            if child.output.finished:
                del self.children[out.request_id]
            self._emit(child, ready)
        return list(ready.values()), to_abort

    def _fold_prompt_logprobs(self, parent: ParentRequest, out: EngineCoreOutput) -> None:
        parent.num_cached_tokens = max(parent.num_cached_tokens, out.num_cached_tokens)
        if out.prompt_logprobs is None or (parent.n > 1 and out.request_id != f"0_{parent.request_id}"):
            return
        if parent.prompt_logprobs is None:
            parent.prompt_logprobs = [None]
        parent.prompt_logprobs.extend(convert_logprobs(lp, self.tokenizer) for lp in out.prompt_logprobs)

    def _emit(self, child: ChildState, ready: dict[str, RequestOutput]) -> None:
        parent = child.parent
        if parent.kind is OutputKind.FINAL_ONLY:
            if parent.finished:
                ready[parent.request_id] = self._final(parent)
            return
        delta = child.delta()
        if parent.request_id in ready:
            ready[parent.request_id].outputs.append(delta)
            ready[parent.request_id].finished = parent.finished
        else:
            ready[parent.request_id] = RequestOutput(
                parent.request_id, parent.prompt, parent.prompt_token_ids, [delta], parent.finished,
                parent.prompt_logprobs, parent.num_cached_tokens)

    @staticmethod
    def _final(parent: ParentRequest) -> RequestOutput:
        outputs = [parent.children[i] for i in range(parent.n)]
        return RequestOutput(parent.request_id, parent.prompt, parent.prompt_token_ids, outputs,
                             True, parent.prompt_logprobs, parent.num_cached_tokens)

    def abort(self, request_ids: list[str]) -> list[str]:
        """Forget user requests; returns the engine request ids to abort."""
        engine_ids = [cid for cid, c in self.children.items() if c.parent.request_id in request_ids]
        for cid in engine_ids:
            del self.children[cid]
        return engine_ids

    def has_unfinished_requests(self) -> bool:
        return bool(self.children)

    def clear(self) -> None:
        """Forget every request (the engine has dropped them all)."""
        self.children.clear()
