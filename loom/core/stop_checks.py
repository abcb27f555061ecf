"""Whether a request ends with the token it just sampled: a stop token, its length, or
its grammar. Plain functions of the request, so the scheduler's update loop stays short."""

from __future__ import annotations

from loom.core.request import Request, RequestStatus


def check_stop(request: Request, token_id: int, max_model_len: int) -> bool:
    """Stop tokens and EOS count only past min_tokens; max_tokens and the context always."""
    params = request.sampling_params
    if request.num_output_tokens >= params.min_tokens:
        if token_id in params.stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = token_id
            return True
        if not params.ignore_eos and token_id == request.eos_token_id:
            request.status = RequestStatus.FINISHED_STOPPED
            return True
    if ((request.max_tokens is not None and request.num_output_tokens >= request.max_tokens)
            or request.num_tokens >= max_model_len):
        request.status = RequestStatus.FINISHED_LENGTH
        return True
    return False


def check_grammar(request: Request, token_id: int) -> bool:
    """A guided request ends when its grammar is complete (stop) or fails (error)."""
    if request.grammar is None or not request.grammar.accept(token_id):
        return False
    request.status = (RequestStatus.FINISHED_ERROR if request.grammar.error
                      else RequestStatus.FINISHED_STOPPED)
    return True
