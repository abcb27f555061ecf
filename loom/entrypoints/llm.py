"""`LLM`: offline batched generation (and pooling: `llm_pooling`), driving an in-process
`EngineCore`."""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from loom.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams, check_width
from loom.config import CompilationConfig, ModelConfig
from loom.config_checks import check_bools
from loom.engine.arg_utils import EngineArgs
from loom.entrypoints.llm_pooling import PoolingMethods
from loom.entrypoints.llm_sleep import SleepMethods
from loom.entrypoints.prompt_args import as_list, per_prompt, prompt_list
from loom.engine.core import EngineCore
from loom.frontend.output_processor import OutputKind, OutputProcessor
from loom.frontend.processor import Processor, PromptType
from loom.frontend.tokenizer import Tokenizer, load_tokenizer
from loom.logits_processor import check_picklable, load_classes
from loom.models.loader import generation_config_dir, generation_defaults, tokenizer_path
from loom.lora.request import LoRARequest
from loom.outputs import RequestOutput
from loom.sampling_params import SamplingParams

Message = dict[str, Any]
logger = logging.getLogger(__name__)


class LLM(PoolingMethods, SleepMethods):
    def __init__(self, model: str | None = None, *, tokenizer: str | None = None,
                 dtype: str = "auto", seed: int = 0, tensor_parallel_size: int = 1,
                 compilation_config: CompilationConfig | dict | int | None = None,
                 skip_tokenizer_init: bool = False, chat_template: str | None = None,
                 disable_log_stats: bool = True, **engine_kwargs) -> None:
        """vLLM's LLM; disable_log_stats: vLLM's, whose default (true) is what loom's offline
        engine does (no periodic stats lines); false is refused (`loom serve` logs them)."""
        if disable_log_stats is not True:
            raise ValueError(f"disable_log_stats: the offline LLM logs no periodic stats "
                             f"(loom serve does), so only true is taken, got "
                             f"{disable_log_stats!r}")
        for name, value in (("tokenizer", tokenizer), ("chat_template", chat_template)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name}: must be a path (a str) or None, got "
                                 f"{type(value).__name__}")
        check_bools({"skip_tokenizer_init": skip_tokenizer_init})
        args = EngineArgs(model=model, tokenizer=tokenizer, dtype=dtype, seed=seed,
                          tensor_parallel_size=tensor_parallel_size,
                          compilation_config=compilation_config, **engine_kwargs)
        config = args.create_engine_config()
        config.parallel.check_one_engine("LLM")
        # Before the model loads: a bad generation_config is an error in a moment.
        self.default_sampling_params = _default_params(config.model)
        self.logprobs_mode = config.model.logprobs_mode
        self.tokenizer = None if skip_tokenizer_init else self._load_tokenizer(config, chat_template)
        logits_processors = load_classes(config.model.logits_processors)  # before loading
        if config.parallel.tensor_parallel_size > 1:
            check_picklable(config.model.logits_processors)
        self.engine = EngineCore(config)
        self.tasks = self.engine.tasks
        """What the model serves (`loom.tasks`): generate, or embed, classify, score."""
        self._shut_down = False
        self._lock = threading.RLock()
        info = self.engine.get_model_info()
        self.processor = Processor(self.tokenizer, info["max_model_len"], info["vocab_size"],
                                   info["eos_token_id"], info["max_logprobs"], info["lora"],
                                   info["scheduling_policy"], self.tasks, logits_processors)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate uses without sampling_params: SamplingParams() with the model's
        generation_config.json recommendations (temperature, top_p, top_k, min_p,
        repetition_penalty, max_new_tokens), as vLLM does; plain SamplingParams() with
        generation_config="vllm"."""
        return self.default_sampling_params

    @staticmethod
    def _load_tokenizer(config, chat_template: str | None) -> Tokenizer:
        path = tokenizer_path(config.model)
        if path is None:
            raise ValueError(f"tokenizer: {config.model.model} ships no tokenizer; pass one "
                             "(tokenizer=..., --tokenizer), or skip_tokenizer_init=True with "
                             "token-id prompts")
        return load_tokenizer(path, chat_template=chat_template,
                              generation_config=generation_config_dir(
                                  config.model.generation_config))

    def get_tokenizer(self) -> Tokenizer | None:
        return self.tokenizer

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
                 priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """Generate for each prompt (a string or a list of token ids); outputs in input order.
        lora_request: the LoRA adapter of every prompt, or one per prompt (None: the base
        model's). priority: vLLM's, one per prompt (lower first; scheduling_policy
        "priority" only); None: all 0."""
        self._check_open()
        self._check_awake()
        self.require("generate", "LLM.generate()")
        salts = _cache_salts(prompts)
        prompts = prompt_list(prompts)
        params = self._params_per_prompt(sampling_params, len(prompts))
        loras = _loras_per_prompt(lora_request, len(prompts))
        priorities = self._priorities(priority, len(prompts))
        # validates all before adding any
        requests = self._prepare(prompts, params, salts, loras)
        with self._abort_on_error():
            for (request_id, prompt, prompt_ids, p), salt, lora, rank in zip(
                    requests, salts, loras, priorities):
                for child_id, child_params in self.output_processor.add_request(
                        request_id, prompt, prompt_ids, p, OutputKind.FINAL_ONLY):
                    self.engine.add_request(self.processor.process(
                        child_id, prompt_ids, child_params, salt, lora, rank))
            outputs = self._run(len(requests), use_tqdm)
        order = {r[0]: i for i, r in enumerate(requests)}
        return sorted(outputs, key=lambda o: order[o.request_id])

    def beam_search(self, prompts, params: BeamSearchParams,
                    lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
                    use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """vLLM's beam search (`loom.beam_search`): each round one batched generate call of
        one token for every live beam of every prompt; lora_request as generate's."""
        self._check_open()
        self.require("generate", "LLM.beam_search()")
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params: expected BeamSearchParams, got {type(params).__name__}")
        check_width(params, self.processor.max_logprobs, "beam_width", self.logprobs_mode)
        eos = self.processor.eos_token_id
        prompts = prompt_list(prompts)
        loras = _loras_per_prompt(lora_request, len(prompts))
        searches = [BeamSearch(self.processor.tokenize(p)[1], params, eos) for p in prompts]
        with tqdm(total=params.max_tokens, desc="Beam search", disable=not use_tqdm) as bar:
            while live := [i for i, s in enumerate(searches) if not s.done]:
                batch = [ids for i in live for ids in searches[i].prompts()]
                batch_loras = [loras[i] for i in live for _ in searches[i].beams]
                outs = iter(self.generate(batch, searches[live[0]].round_params(),
                                          use_tqdm=False, lora_request=batch_loras))
                for i in live:
                    searches[i].advance([next(outs).outputs[0] for _ in searches[i].beams])
                bar.update(1)

        def decode(ids: list[int]) -> str:
            return self.tokenizer.decode(ids) if self.tokenizer is not None else ""
        return [BeamSearchOutput(s.best(decode)) for s in searches]

    def chat(self, messages: list[Message] | list[list[Message]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, chat_template: str | None = None,
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             tools: list[dict[str, Any]] | None = None,
             chat_template_kwargs: dict[str, Any] | None = None,
             lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
             priority: Sequence[int] | None = None,
             chat_template_content_format: str = "auto") -> list[RequestOutput]:
        """Apply the chat template to each conversation, then generate. As vLLM's: tools and
        chat_template_kwargs reach the template (no tool calls are parsed offline);
        continue_final_message continues the last (assistant) message; lora_request and
        priority (one per conversation) as generate's; chat_template_content_format
        ("auto", "string", "openai") how message content reaches the template, as the
        server's --chat-template-content-format."""
        self._check_open()
        self.require("generate", "LLM.chat()")
        if self.tokenizer is None:
            raise ValueError("chat: needs a tokenizer (skip_tokenizer_init was set)")
        texts = [self.chat_prompt(c, chat_template, add_generation_prompt,
                                  continue_final_message, tools, chat_template_kwargs,
                                  chat_template_content_format)
                 for c in _conversations(messages)]
        # The template writes the special tokens (BOS) itself.
        prompts = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        outputs = self.generate(prompts, sampling_params, use_tqdm, lora_request, priority)
        for output, text in zip(outputs, texts):
            output.prompt = text  # as vLLM: the rendered conversation
        return outputs

    def chat_prompt(self, conversation: list[Message], chat_template: str | None = None,
                    add_generation_prompt: bool = True, continue_final_message: bool = False,
                    tools: list[dict[str, Any]] | None = None,
                    chat_template_kwargs: dict[str, Any] | None = None,
                    content_format: str = "auto") -> str:
        """The conversation rendered by the chat template, as the server renders it."""
        from loom.entrypoints.openai.protocol_chat import (ChatMessage, check_chat_options,
                                                           render_chat)
        from loom.entrypoints.openai.tool_calls import check_tools
        check_tools(tools, "none")
        check_chat_options(add_generation_prompt, continue_final_message, chat_template_kwargs)
        try:
            # As the server takes them: OpenAI's text content parts are joined into a string.
            messages = [ChatMessage.model_validate(m) for m in conversation]
        except ValueError as e:  # pydantic's ValidationError
            raise ValueError(f"messages: {e}") from None
        variables = {**(chat_template_kwargs or {}), "tools": tools or None}
        return render_chat(self.tokenizer, messages, add_generation_prompt,
                           continue_final_message, chat_template, variables, content_format)

    def chat_prompt_ids(self, conversation: list[Message], chat_template: str | None = None,
                        add_generation_prompt: bool = True) -> list[int]:
        text = self.chat_prompt(conversation, chat_template, add_generation_prompt)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _priorities(self, priority: Sequence[int] | None, count: int) -> list[int]:
        """One priority per prompt, each checked before any request is added."""
        if priority is None:
            return [0] * count
        if not isinstance(priority, list | tuple) or len(priority) != count:
            raise ValueError(f"priority: must be a list of one integer per prompt ({count}), "
                             f"got {priority!r}")
        for value in priority:
            self.processor.check_priority(value)
        return list(priority)

    def _check_open(self) -> None:
        if self._shut_down:
            raise RuntimeError("LLM: shut down; build a new LLM to generate again")

    @contextlib.contextmanager
    def _abort_on_error(self):
        """A call that ends in an exception (Ctrl-C included) leaves no request behind: an
        interrupt between scheduling a step and collecting it would otherwise leave the
        scheduler counting a token in flight that never comes, and the next call would
        wait for it forever (and get this call's outputs). Calls from several threads run
        one after another: the engine's steps and outputs are one call's at a time."""
        with self._lock:
            try:
                yield
            except BaseException:
                try:
                    self.engine.abort_all()
                except Exception:  # noqa: BLE001 - a dead worker: the first error is the one
                    logger.debug("LLM: abort after an error failed too", exc_info=True)
                self.output_processor.clear()
                raise

    def _params_per_prompt(self, params, count: int) -> list[SamplingParams]:
        if params is None:
            return [self.default_sampling_params] * count
        return per_prompt(params, count, SamplingParams, "sampling_params")

    def _prepare(self, prompts, params, salts, loras):
        requests = []
        for prompt, p, salt, lora in zip(prompts, params, salts, loras):
            text, ids = self.processor.tokenize(prompt)
            request_id = str(next(self._ids))
            # (the prompt truncated as truncate_prompt_tokens says)
            ids = self.processor.process(request_id, ids, p, salt, lora,
                                         text=text is not None).prompt_token_ids
            requests.append((request_id, text, ids, p))
        return requests

    def _run(self, num_requests: int, use_tqdm: bool) -> list[RequestOutput]:
        finished: list[RequestOutput] = []
        with tqdm(total=num_requests, desc="Processed prompts", disable=not use_tqdm) as bar:
            while self.output_processor.has_unfinished_requests():
                step = self.engine.step()
                ready, to_abort = self.output_processor.process_outputs(step.outputs)
                if to_abort:
                    self.engine.abort_requests(to_abort)
                finished.extend(ready)
                bar.update(len(ready))
        return finished

    def start_profile(self) -> None:
        """vLLM's: torch.profiler on every rank until stop_profile() (LOOM_TORCH_PROFILER_DIR
        set, else a ValueError)."""
        self._check_open()
        with self._lock:
            self.engine.profile(True)

    def stop_profile(self) -> str:
        """Stop the profile and write it: every rank's Chrome trace (trace-rank*.json) and op
        tables, in a new folder under LOOM_TORCH_PROFILER_DIR, which this returns."""
        self._check_open()
        with self._lock:
            return self.engine.profile(False)

    def reset_prefix_cache(self) -> bool:
        self._check_open()
        with self._lock:
            return self.engine.reset_prefix_cache()

    def shutdown(self) -> None:
        if not self._shut_down:
            self._shut_down = True
            self.engine.shutdown()


def _default_params(model: ModelConfig) -> SamplingParams:
    defaults = generation_defaults(model.model, model.generation_config,
                                   model.override_generation_config)
    if not defaults:
        return SamplingParams()
    source = generation_config_dir(model.generation_config) or model.model
    overridden = " and override_generation_config" if model.override_generation_config else ""
    logger.info("sampling defaults from %s's generation_config.json%s: %s", source, overridden,
                defaults)
    return SamplingParams(**defaults)  # each value checked by generation_defaults


def _loras_per_prompt(loras, count: int) -> list[LoRARequest | None]:
    """One adapter for every prompt, or one each (None: the base model); the Processor
    checks each."""
    if loras is None or not isinstance(loras, list | tuple):
        return [loras] * count
    if len(loras) != count:
        raise ValueError(f"lora_request: {len(loras)} given for {count} prompts")
    return list(loras)


def _conversations(messages) -> list[list[Message]]:
    """One conversation (a list of message dicts) or several (a list of such lists)."""
    def is_conversation(c) -> bool:
        return isinstance(c, list) and bool(c) and all(isinstance(m, dict) for m in c)
    if is_conversation(messages):
        return [messages]
    if isinstance(messages, list) and messages and all(is_conversation(c) for c in messages):
        return messages
    raise ValueError("messages: must be a conversation (a non-empty list of "
                     "{'role': ..., 'content': ...} dicts) or a list of conversations")


def _cache_salts(prompts) -> list[str | None]:
    """vLLM's prompt dicts may carry a cache_salt; one entry (None or the salt) per prompt."""
    return [p.get("cache_salt") if isinstance(p, dict) else None for p in as_list(prompts)]
