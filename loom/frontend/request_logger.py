"""`--enable-log-requests`: one INFO line for each request the server accepts, with its id,
its sampling (or pooling) parameters and its prompt, cut to `--max-log-len` characters and
token ids. With `--enable-log-outputs` too, one more line when a generation finishes: each
completion's text, token ids (cut alike) and finish reason. Without the flag there is no
`RequestLogger`, and nothing about what a request says reaches the log."""

from __future__ import annotations

import logging

import msgspec

from loom.frontend.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


class RequestLogger:
    def __init__(self, tokenizer: Tokenizer | None, max_log_len: int | None = None,
                 log_outputs: bool = False) -> None:
        self.tokenizer = tokenizer
        self.max_log_len = max_log_len
        """How much of the prompt to log: characters of its text and token ids; None: all."""
        self.log_outputs = log_outputs
        """--enable-log-outputs: `log_output` logs each finished generation."""

    def log_output(self, request_id: str, index: int, text: str, token_ids: list[int],
                   finish_reason: str | None) -> None:
        if not logger.isEnabledFor(logging.INFO):
            return
        cut = self.max_log_len
        logger.info("Generated response %s (completion %d): output: %r, output_token_ids: %s, "
                    "finish_reason: %s", request_id, index, text if cut is None else text[:cut],
                    token_ids if cut is None else token_ids[:cut], finish_reason)

    def log(self, request_id: str, text: str | None, token_ids: list[int],
            params: msgspec.Struct, lora_request: msgspec.Struct | None = None) -> None:
        if not logger.isEnabledFor(logging.INFO):
            return
        ids = token_ids if self.max_log_len is None else token_ids[:self.max_log_len]
        if text is None and self.tokenizer is not None:
            # Chat and completion prompts reach the engine as token ids; what they say (the
            # rendered chat template included) is what an operator looks for.
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
        if text is not None and self.max_log_len is not None:
            text = text[:self.max_log_len]
        logger.info("Received request %s: prompt: %r, params: %s, prompt_token_ids: %s%s",
                    request_id, text, params, ids,
                    "" if lora_request is None else f", lora_request: {lora_request}")
