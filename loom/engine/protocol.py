"""Every message between the frontend and the engine core: a closed set of msgspec Structs.

The same structs are passed by reference in-process and encoded as msgpack over ZeroMQ,
with typed decoders: an unknown or malformed frame fails to decode, it never runs code.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

import msgspec

from loom.lora.request import LoRARequest
from loom.pooling_params import PoolingParams
from loom.sampling_params import SamplingParams


class FinishReason(enum.IntEnum):
    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3

    def __str__(self) -> str:
        return self.name.lower()


class EngineCoreRequest(msgspec.Struct, tag="add", array_like=True, omit_defaults=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0
    eos_token_id: int | None = None
    pooling_params: PoolingParams | None = None
    """Set for an embedding request: the engine pools its prompt's hidden states and
    samples nothing (its sampling_params are then only the one-step placeholder)."""
    cache_salt: str | None = None
    """vLLM's: only requests with the same salt share prefix-cache blocks."""
    lora_request: LoRARequest | None = None
    """The LoRA adapter it runs with (checked by the Processor); None: the base model."""
    priority: int = 0
    """vLLM's: under --scheduling-policy priority, lower values are served first (the
    Processor refuses any other value under fcfs)."""


class AbortRequests(msgspec.Struct, tag="abort", array_like=True):
    request_ids: list[str]


class UtilityCall(msgspec.Struct, tag="utility", array_like=True):
    """A call of a named EngineCore method that answers once (stats, reset_prefix_cache...)."""
    call_id: int
    method: str
    args: list[Any] = []
    """Plain values: scalars, and lists and dicts of them (sleep's tags, a worker call's)."""


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    pass


EngineCoreInput = EngineCoreRequest | AbortRequests | UtilityCall | Shutdown


class Logprobs(msgspec.Struct, array_like=True):
    """Logprobs for one position: the chosen token first, then the top-N alternatives."""
    token_ids: list[int]
    logprobs: list[float]
    rank: int
    """Rank of the chosen token among the vocabulary (1 = most likely)."""


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[Logprobs] | None = None
    prompt_logprobs: list[Logprobs] | None = None
    """Per prompt position from the second on (the first token has no logprob)."""
    finish_reason: FinishReason | None = None
    stop_reason: int | None = None
    """The stop token id that finished the request, if any."""
    num_cached_tokens: int = 0
    error: str | None = None
    pooled: list[float] | None = None
    """A pooling request's vector, on its one (finished) output."""
    queue_time_s: float | None = None
    """Seconds from the engine core receiving the request to first scheduling it; on the
    request's first output only."""
    prefill_time_s: float | None = None
    """Seconds from first scheduling the request to its first token; on the output that
    carries that token only."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class SchedulerStats(msgspec.Struct, array_like=True, omit_defaults=True):
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    """Prompt tokens looked up in the prefix cache since the last stats (a delta)."""
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    spec_num_drafts: int = 0
    """Speculative decoding: verified steps of drafting requests (a delta)."""
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = []
    """Accepted drafts by position in the draft ([] when none were verified)."""
    max_loras: int = 0
    """LoRA: the adapters a step may use (0: LoRA off); then the names of the adapters of
    running and of waiting requests (vLLM's lora_requests_info)."""
    running_lora_adapters: list[str] = []
    waiting_lora_adapters: list[str] = []


CALL_ERRORS = (ValueError, TypeError, NotImplementedError)
"""What a utility call or a worker RPC may raise as its caller's error (bad input, a method
loom lacks), answered as `call_error` text; anything else is the engine's or rank's own."""


def call_error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def raise_call_error(text: str):
    """call_error's text raised again as its kind (ValueError where unknown)."""
    kind, _, message = text.partition(": ")
    raise {"TypeError": TypeError, "NotImplementedError": NotImplementedError}.get(
        kind, ValueError)(message)


class UtilityResult(msgspec.Struct, array_like=True, omit_defaults=True):
    call_id: int
    result: Any = None
    """Plain values: scalars, and lists and dicts of them (the workers' answers)."""
    error: str | None = None


class EngineCoreOutputs(msgspec.Struct, tag="outputs", array_like=True, omit_defaults=True):
    outputs: list[EngineCoreOutput] = []
    timestamp: float = 0.0
    scheduler_stats: SchedulerStats | None = None
    utility_results: list[UtilityResult] = []


class EngineDead(msgspec.Struct, tag="dead", array_like=True):
    """Sent once when the engine core fails; every in-flight request ends with this error."""
    reason: str


EngineCoreMessage = EngineCoreOutputs | EngineDead


class ClientHello(msgspec.Struct, tag="hello", array_like=True):
    """Sent once by each frontend client on its output socket, so that the engine's output
    ROUTER knows the client's route before it sends the client anything."""
    client_index: int


class LoRAInfo(msgspec.Struct, array_like=True):
    """The engine's LoRA limits and the model's adaptable modules (`lora.adapter`)."""
    max_lora_rank: int
    targets: dict[str, list[int]]
    """Module name -> [out, in] of its full weight."""


Task = Literal["generate", "embed", "classify", "score"]
"""vLLM's supported tasks: what a served model answers (generation, or a pooling task)."""
Activation = Literal["softmax", "sigmoid", "identity", "tanh"]
"""What turns a classifier's logits into its probabilities or score (`loom.tasks.activate`)."""


class ModelTasks(msgspec.Struct, array_like=True, frozen=True):
    """What the served model does, decided from its config and --runner/--convert
    (`loom.tasks.model_tasks`), and what the frontend needs to finish a classifier's
    outputs."""
    architecture: str
    tasks: list[Task]
    labels: list[str] = []
    """A classifier's class names (config.json's id2label), by index."""
    classify_activation: Activation = "softmax"
    """For classify: from config.json's problem_type, else sigmoid for one label, softmax
    for more (vLLM's rule)."""
    score_activation: Activation = "sigmoid"
    """For score (cross-encoders): the sentence-transformers activation the config names,
    else as classify's default."""
    use_sep_token: bool = True
    """Score a pair as the tokenizer's pair encoding; False (config.json's use_sep_token):
    as the two texts joined, tokenized as one (vLLM's "LLM as reranker")."""
    pad_token_id: int | None = None
    """A classifier's: it reads the last prompt token that is not this one."""
    pooling_type: str | None = None
    """The model's own pooling for embed, which every embed request takes (its
    sentence-transformers Pooling module's; an encoder's default cls); None: the
    request's."""
    embedding_size: int = 0
    """An embedding's values: the hidden size, or the last sentence-transformers Dense
    module's out_features."""
    embed_normalize: bool = True
    """--pooler-config's normalize: what an embed request that leaves normalize unset
    gets."""
    default_dimensions: int | None = None
    """--pooler-config's dimensions: what an embed request that leaves dimensions unset
    gets."""
    use_activation: bool = True
    """--pooler-config's use_activation: what a classify or score request that leaves
    use_activation unset gets."""
    matryoshka_dimensions: list[int] | None = None
    """vLLM's: the embedding sizes a request's `dimensions` may ask for ([]: any up to
    embedding_size), from config.json's is_matryoshka / matryoshka_dimensions; None: the
    model's embeddings are whole only."""

    def supports(self, task: str) -> bool:
        return task in self.tasks

    @property
    def own_pooling_task(self) -> str:
        """What /pooling and LLM.encode pool when the request names no task: a classifier
        classifies, every other model embeds."""
        return "classify" if "classify" in self.tasks else "embed"

    @property
    def is_cross_encoder(self) -> bool:
        """Scored by running each pair as one sequence, not by embedding cosines."""
        return "classify" in self.tasks


GENERATIVE = ModelTasks("", ["generate", "embed"])
"""A causal LM's tasks under --runner auto (loom also pools its hidden states)."""


class EngineReady(msgspec.Struct, tag="ready", array_like=True):
    """The engine core process's answer to its launcher once the model and KV cache are up."""
    vocab_size: int
    max_model_len: int
    eos_token_id: int | None
    num_blocks: int
    block_size: int
    max_logprobs: int = 20
    """The most top logprobs a request may ask for (ModelConfig.max_logprobs, -1 resolved
    to the vocabulary's size): the frontend refuses more, naming the field."""
    lora: LoRAInfo | None = None
    """What the frontend checks adapters against; None: LoRA is off."""
    scheduling_policy: str = "fcfs"
    """SchedulerConfig.scheduling_policy: the frontend refuses priorities under fcfs."""
    tasks: ModelTasks = GENERATIVE
    """What the model serves; the API server routes and refuses by it."""
    logprobs_mode: str = "raw_logprobs"
    """ModelConfig.logprobs_mode: beam search, which ranks by logprobs, refuses logits."""
    logits_processors: list[str] = []
    """ModelConfig.logits_processors given by name: the frontend checks each request's
    params with their classes' validate_params."""

    @classmethod
    def of(cls, core) -> EngineReady:
        """An EngineCore's answer."""
        info, kv = core.get_model_info(), core.get_kv_info()
        return cls(info["vocab_size"], info["max_model_len"], info["eos_token_id"],
                   kv["num_blocks"], kv["block_size"], info["max_logprobs"], info["lora"],
                   info["scheduling_policy"], core.tasks, info["logprobs_mode"],
                   info["logits_processors"])


EngineStartup = EngineReady | EngineDead
"""What an engine core process sends its launcher: ready, or why it could not start."""
