"""Build a model on its device in its dtype and fill its weights (checkpoint or dummy)."""

from __future__ import annotations

import contextlib
import logging

import torch
from torch import nn
from tqdm import tqdm

from loom.config import EngineConfig
from loom.layers.linear import weights_on_meta
from loom.models.arch import ModelArch, resolve_max_model_len
from loom.models.loader import resolve
from loom.models.loader.dummy import init_dummy_weights
from loom.models.registry import model_class
from loom.quantization.config import quant_scheme
from loom.quantization.int4_config import Int4Scheme

logger = logging.getLogger(__name__)

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_dtype(requested: str, checkpoint: str | None, device: torch.device) -> torch.dtype:
    if requested != "auto":
        return _DTYPES[requested]
    if device.type == "cpu":
        return torch.float32  # half precision on CPU is slow and less exact
    if checkpoint in ("bfloat16", "float16"):
        return _DTYPES[checkpoint]
    return torch.bfloat16


_KV_CACHE_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
                    "fp8_e5m2": torch.float8_e5m2}


def resolve_kv_cache_dtype(requested: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV cache's element type for `CacheConfig.cache_dtype` (auto: the model's)."""
    return model_dtype if requested == "auto" else _KV_CACHE_DTYPES[requested]


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def load_model(config: EngineConfig, device: torch.device) -> tuple[nn.Module, ModelArch, torch.dtype]:
    source = resolve(config.model)
    arch = ModelArch.from_hf_config(source.hf_config)
    cls = model_class(arch)
    dtype = resolve_dtype(config.model.dtype, arch.dtype, device)
    scheme = quant_scheme(source.hf_config, config.model.quantization)
    # A model to be quantized is built without its linear weights (`weights_on_meta`):
    # quantize_model gives them storage in fp8, or in the model's dtype where the
    # checkpoint leaves a layer unquantized.
    deferred = weights_on_meta() if scheme is not None else contextlib.nullcontext()
    # Before anything is sized by it (the rotary table): 10**9 would be an allocator error.
    max_model_len = resolve_max_model_len(config.model.max_model_len, arch.context_len)
    with _default_dtype(dtype), torch.device(device), deferred:
        model = cls(arch, max_model_len=max_model_len)
    if scheme is not None:
        from loom.quantization import fp8, int4
        # Dummy weights are drawn in the model's dtype and quantized like any other.
        from_checkpoint = scheme.weights_in_checkpoint and source.weights is not None
        int4_weights = isinstance(scheme, Int4Scheme)
        (int4 if int4_weights else fp8).quantize_model(model, scheme, from_checkpoint, device)
        name, kind = str(dtype).removeprefix("torch."), "int4" if int4_weights else "fp8"
        if not getattr(scheme, "experts_only", False):  # (experts_int8 says its own)
            logger.info("%s: linear weights built and loaded a layer at a time, %s (no %s "
                        "copy of the model)", kind, f"in {kind} as the checkpoint has them"
                        if from_checkpoint else f"each quantized once its rows have arrived "
                        f"in {name}", name)
    if arch.classifier_from_token:  # before loading: the LM head's rows it keeps
        model.classifier_token_ids = _classifier_token_ids(source.tokenizer_path, arch)
    if source.weights is None:
        init_dummy_weights(model, config.model.seed)
    else:
        weights = tqdm(source.weights(), desc="Loading weights", unit=" tensors", leave=False,
                       disable=None)
        model.load_weights(weights)
    if scheme is not None:
        from loom.quantization.staging import check_materialized
        check_materialized(model)
        if isinstance(scheme, Int4Scheme):
            from loom.quantization.int4 import finish_loading
            finish_loading(model)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the staging tensors' cached blocks
    if hasattr(model, "after_loading"):  # a model's own last step (Granite's folding)
        model.after_loading()
    if getattr(model, "needs_sep_token", False):
        model.sep_token_id = _sep_token_id(source.tokenizer_path, arch.architecture)
    return model.eval(), arch, dtype


def reload_weights(model: nn.Module, config: EngineConfig,
                   weights: list[tuple[str, torch.Tensor]] | None = None) -> None:
    """Fill the model's parameters again, in place (their memory, and every CUDA graph
    reading it, stays): from the checkpoint (dummy weights drawn again), or the named
    tensors given, which may be some of the model's (an RL trainer's update)."""
    from loom.models.weights import partial
    source = resolve(config.model)
    if quant_scheme(source.hf_config, config.model.quantization) is not None:
        raise NotImplementedError("reload_weights: a quantized model's weights are built "
                                  "while loading; loom reloads unquantized models only")
    if hasattr(model, "after_loading"):  # it would fold an update into folded weights
        raise NotImplementedError(f"reload_weights: {type(model).__name__} changes its "
                                  "weights after loading; loom cannot reload them in place")
    with torch.no_grad():
        if weights is not None:
            with partial():
                model.load_weights(weights)
            return
        if source.weights is None:
            init_dummy_weights(model, config.model.seed)
        else:
            model.load_weights(source.weights())


def _classifier_token_ids(path: str | None, arch: ModelArch) -> list[int]:
    """classifier_from_token's ids in the model's tokenizer."""
    from loom.frontend.tokenizer import load_tokenizer
    if path is None:
        raise ValueError("classifier_from_token: names tokens of the model's tokenizer, and "
                         "it has none")
    tokenizer = load_tokenizer(path)
    ids = [tokenizer.token_to_id(t) for t in arch.classifier_from_token]
    missing = [t for t, i in zip(arch.classifier_from_token, ids) if i is None]
    if missing:
        raise ValueError(f"classifier_from_token: {missing} not in the tokenizer's vocabulary")
    return ids


def _sep_token_id(path: str | None, architecture: str) -> int:
    """The [SEP] id of the model's tokenizer: where a BERT pair's second text begins."""
    from loom.frontend.tokenizer import load_tokenizer
    sep = load_tokenizer(path).sep_token_id if path is not None else None
    if sep is None:
        raise ValueError(f"tokenizer: {architecture} types a pair's second text by the "
                         "tokenizer's sep_token, and the model's tokenizer names none")
    return sep
