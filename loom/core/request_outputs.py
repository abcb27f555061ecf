"""A scheduled request's `EngineCoreOutput`s, as the scheduler hands them to the engine:
a step's new tokens (with their logprobs and the request's timings), or a pooling
request's vector."""

from __future__ import annotations

from loom.core.request import Request, RequestStatus
from loom.engine.protocol import EngineCoreOutput, FinishReason, Logprobs


def pooling_output(request: Request, pooled: list[float]) -> EngineCoreOutput:
    """A pooling request ends when its prompt is computed: no tokens, only the vector."""
    request.status = RequestStatus.FINISHED_STOPPED
    return EngineCoreOutput(request.request_id, [], finish_reason=FinishReason.STOP,
                            num_cached_tokens=max(0, request.num_cached_tokens),
                            pooled=pooled, queue_time_s=request.take_queue_time())


def token_output(request: Request, new_token_ids: list[int],
                 prompt_logprobs: list[Logprobs] | None,
                 new_logprobs: list[Logprobs] | None) -> EngineCoreOutput:
    return EngineCoreOutput(
        request_id=request.request_id, new_token_ids=new_token_ids,
        new_logprobs=new_logprobs[:len(new_token_ids)] if new_logprobs else None,
        prompt_logprobs=prompt_logprobs, finish_reason=request.status.finish_reason,
        stop_reason=request.stop_reason, num_cached_tokens=max(0, request.num_cached_tokens),
        queue_time_s=request.take_queue_time(),
        prefill_time_s=request.take_prefill_time(new_token_ids),
        error=request.grammar.error if request.grammar is not None else None)
