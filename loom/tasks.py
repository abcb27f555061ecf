"""What a served model does (vLLM's supported tasks) and how a classifier's logits become
probabilities and scores. Plain Python on config dicts and lists: the engine core decides the
tasks once, the frontends (the torch-free API server included) act on them.

- A causal LM generates, and loom also pools its hidden states (embed) under --runner auto;
  --runner generate keeps generation only, --runner pooling or --convert embed embeddings
  only, as vLLM's flags do.
- A *ForSequenceClassification model classifies; with one label it is also a cross-encoder
  that scores (query, document) pairs (vLLM: "Score API is only enabled for num_labels == 1").
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from loom.engine.protocol import Activation, ModelTasks
from loom.models.arch import is_base_model, is_classifier, is_encoder, num_labels
from loom.pooler_config import pooling_type

TASK_FLAG = {"auto": (None, None), "generate": ("generate", None),
             "embed": ("pooling", "embed"), "embedding": ("pooling", "embed"),
             "classify": ("pooling", "classify"), "score": ("pooling", "classify")}
"""vLLM's deprecated --task -> the (--runner, --convert) it stands for."""

_ST_ACTIVATIONS: dict[str, Activation | None] = {
    "Identity": "identity", "Sigmoid": None, "Softmax": None, "Tanh": "tanh"}
"""sentence-transformers' cross-encoder activation (a torch.nn module's name) -> loom's; None:
vLLM's default (sigmoid for one label, softmax for more)."""


def model_tasks(hf_config: dict[str, Any], runner: str = "auto",
                convert: str = "auto", model_dir: str | None = None,
                pooler: dict[str, Any] | None = None) -> ModelTasks:
    """The tasks of the model a config.json describes, under vLLM's --runner/--convert; a
    ValueError naming the flag for a combination that cannot run. model_dir: where its
    sentence-transformers files may name its pooling; pooler: --pooler-config's defaults
    (`loom.pooler_config`), over the model's own."""
    architecture = (hf_config.get("architectures") or ["?"])[0]
    pooler = pooler or {}
    pooling = pooling_type(pooler) or (
        sentence_transformers_pooling(model_dir) if model_dir else None)
    embedding = {**_embedding_facts(hf_config, model_dir),
                 "embed_normalize": pooler.get("normalize", True),
                 "default_dimensions": pooler.get("dimensions"),
                 "use_activation": pooler.get("use_activation", True)}
    if is_encoder(architecture) and not is_classifier(architecture):
        if runner == "generate" or convert == "classify":
            flag = "runner" if runner == "generate" else "convert"
            raise ValueError(f"{flag}: {architecture} is an encoder (an embedding model): it "
                             "embeds, and neither generates nor classifies")
        # vLLM's default for BERT-like embedders: the first ([CLS]) token's state.
        return ModelTasks(architecture, ["embed"], pooling_type=pooling or "cls", **embedding)
    if not is_classifier(architecture):
        return ModelTasks(architecture, _decoder_tasks(architecture, runner, convert),
                          pooling_type=pooling, **embedding)
    if runner == "generate":
        raise ValueError(f"runner: {architecture} is a classification model (a score head, no "
                         "LM head): it cannot generate; use --runner pooling (or auto)")
    if convert == "embed":
        raise ValueError(f"convert: {architecture} is a classification model; it classifies "
                         "(and with one label scores pairs) but embeds nothing")
    labels = _labels(hf_config)
    default: Activation = "sigmoid" if len(labels) < 2 else "softmax"
    return ModelTasks(
        architecture, ["classify", "score"] if len(labels) == 1 else ["classify"], labels,
        _classify_activation(hf_config, default), _score_activation(hf_config, default),
        _use_sep_token(hf_config), hf_config.get("pad_token_id"),
        use_activation=embedding["use_activation"])


_ST_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
               "pooling_mode_lasttoken": "last"}
"""sentence-transformers' Pooling modes -> loom's pooling types."""


def _embedding_facts(cfg: dict[str, Any], model_dir: str | None) -> dict[str, Any]:
    size = int(cfg.get("hidden_size") or 0)
    for module in st_modules(model_dir, ".Dense") if model_dir else []:
        with open(os.path.join(model_dir, module.get("path", ""), "config.json")) as f:
            size = int(json.load(f)["out_features"])
    dims = cfg.get("matryoshka_dimensions")
    matryoshka = [int(d) for d in dims] if dims else ([] if cfg.get("is_matryoshka") else None)
    return {"embedding_size": size, "matryoshka_dimensions": matryoshka}


def check_dimensions(dimensions: int | None, tasks: ModelTasks) -> None:
    """vLLM's rule for an embedding request's `dimensions`: only a matryoshka model's, one
    of its matryoshka_dimensions where it lists them, never more than the embedding has."""
    if dimensions is None:
        return
    sizes = tasks.matryoshka_dimensions
    if sizes is None:
        raise ValueError(f"dimensions: {tasks.architecture} does not support reduced "
                         "(matryoshka) dimensions; leave the field out (a matryoshka model "
                         "says is_matryoshka in config.json; --hf-overrides can set it)")
    if sizes and dimensions not in sizes:
        raise ValueError(f"dimensions: {dimensions} is not one of the model's matryoshka "
                         f"dimensions {sizes}")
    if tasks.embedding_size and dimensions > tasks.embedding_size:
        raise ValueError(f"dimensions: {dimensions} is more than the model's embedding has "
                         f"({tasks.embedding_size})")


def st_modules(model_dir: str, kind: str) -> list[dict[str, Any]]:
    """The sentence-transformers modules of a kind (".Pooling", ".Dense") that modules.json
    lists, in order; [] without one."""
    modules_file = os.path.join(model_dir, "modules.json")
    if not os.path.isfile(modules_file):
        return []
    with open(modules_file) as f:
        modules = sorted(json.load(f), key=lambda m: m.get("idx", 0))
    return [m for m in modules if str(m.get("type", "")).endswith(kind)]


def sentence_transformers_pooling(model_dir: str) -> str | None:
    """The pooling a sentence-transformers model directory's Pooling module names (its
    modules.json, then that module's config.json), as vLLM reads it; None without one."""
    pooling = next(iter(st_modules(model_dir, ".Pooling")), None)
    if pooling is None:
        return None
    config_file = os.path.join(model_dir, pooling.get("path", ""), "config.json")
    with open(config_file) as f:
        modes = [k for k, v in json.load(f).items() if k.startswith("pooling_mode") and v]
    if len(modes) != 1 or modes[0] not in _ST_POOLING:
        raise ValueError(f"{config_file}: pooling modes {modes} are not one loom applies "
                         f"(one of {', '.join(_ST_POOLING)})")
    return _ST_POOLING[modes[0]]


def _decoder_tasks(architecture: str, runner: str, convert: str) -> list[str]:
    if is_base_model(architecture):
        if runner == "generate":
            raise ValueError(f"runner: {architecture} is a base model without an LM head (as "
                             "embedding models ship): it embeds, and cannot generate; use "
                             "--runner pooling (or auto)")
        runner = "pooling"
    if convert == "classify":
        raise ValueError(f"convert: 'classify' needs a classification head, and {architecture} "
                         "has none; loom classifies with *ForSequenceClassification checkpoints")
    if convert == "embed" and runner == "generate":
        raise ValueError("convert: 'embed' makes a pooling model; it does not go with "
                         "--runner generate")
    if runner == "pooling" or convert == "embed":
        return ["embed"]
    return ["generate"] if runner == "generate" else ["generate", "embed"]


def _labels(cfg: dict[str, Any]) -> list[str]:
    names = {str(k): str(v) for k, v in (cfg.get("id2label") or {}).items()}
    return [names.get(str(i), f"LABEL_{i}") for i in range(num_labels(cfg))]


def _classify_activation(cfg: dict[str, Any], default: Activation) -> Activation:
    """As transformers' loss for its problem_type (vLLM's rule)."""
    kind = cfg.get("problem_type")
    return {"regression": "identity", "multi_label_classification": "sigmoid"}.get(kind, default)


def _score_activation(cfg: dict[str, Any], default: Activation) -> Activation:
    st = cfg.get("sentence_transformers") or {}
    name = st.get("activation_fn") or cfg.get("sbert_ce_default_activation_function")
    if not name:
        return default
    short = str(name).rsplit(".", 1)[-1]
    if not str(name).startswith("torch.nn.modules.") or short not in _ST_ACTIVATIONS:
        raise ValueError(f"sentence_transformers.activation_fn: {name!r} is not one loom "
                         f"applies (torch.nn's {', '.join(_ST_ACTIVATIONS)})")
    return _ST_ACTIVATIONS[short] or default


def _use_sep_token(cfg: dict[str, Any]) -> bool:
    """vLLM's: the tokenizer's pair encoding unless the config says otherwise (use_pad_token
    is its older name)."""
    for key in ("use_pad_token", "use_sep_token"):
        if cfg.get(key) is not None:
            return bool(cfg[key])
    return True


def activate(logits: list[float], activation: Activation) -> list[float]:
    """A classifier's logits -> its probabilities (or score), in float64."""
    if activation == "identity":
        return list(logits)
    if activation == "tanh":
        return [math.tanh(x) for x in logits]
    if activation == "sigmoid":
        return [_sigmoid(x) for x in logits]
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = math.fsum(exps)
    return [e / total for e in exps]


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def classified_length(prompt_ids: list[int], pad_token_id: int | None) -> int:
    """How much of a prompt a classifier reads: up to its last token that is not the pad
    token (transformers' rule: the first token when all are pad). Under causal attention the
    tokens after it change nothing, so the engine does not run them."""
    if pad_token_id is None:
        return len(prompt_ids)
    end = len(prompt_ids)
    while end > 1 and prompt_ids[end - 1] == pad_token_id:
        end -= 1
    return end


def unsupported(tasks: ModelTasks, task: str, api: str) -> str:
    """vLLM's refusal of an API the model does not serve, and what it serves instead."""
    serves = {"generate": "generation", "embed": "embeddings", "classify": "classification",
              "score": "scoring"}
    does = ", ".join(serves[t] for t in tasks.tasks)
    hint = ""
    if task == "score" and "classify" in tasks.tasks:
        hint = (f" Score API is only enabled for num_labels == 1, and {tasks.architecture} "
                f"has {len(tasks.labels)} labels.")
    elif task == "generate" and not is_classifier(tasks.architecture):
        hint = (" It runs as a pooling model (--runner pooling or --convert embed); start it "
                "with --runner auto or generate to generate.")
    elif task == "embed" and not is_classifier(tasks.architecture):
        hint = (" It runs as a generative model (--runner generate); start it with --runner "
                "auto or pooling to embed.")
    return f"The model does not support {api}: {tasks.architecture} serves {does}.{hint}"
