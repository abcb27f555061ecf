"""Model classes keyed by the `architectures` entry of a Hugging Face config."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from loom.models.arch import BASE_MODELS, ModelArch
from loom.models.bert import (BertForSequenceClassification, BertModel,
                              RobertaForSequenceClassification)
from loom.models.gemma import Gemma2ForCausalLM, Gemma3ForCausalLM, GemmaForCausalLM
from loom.models.gemma_embedding import Gemma3TextModel
from loom.models.granite import GraniteForCausalLM, GraniteMoeForCausalLM
from loom.models.llama import (ArceeForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM,
                               Qwen3ForCausalLM, SmolLM3ForCausalLM)
from loom.models.mixtral import MixtralForCausalLM
from loom.models.modernbert import ModernBertForSequenceClassification, ModernBertModel
from loom.models.glm4 import Glm4ForCausalLM
from loom.models.interleaved_rope import Ernie4_5ForCausalLM
from loom.models.olmo2 import Exaone4ForCausalLM, Olmo2ForCausalLM, Olmo3ForCausalLM
from loom.models.phi3 import Phi3ForCausalLM
from loom.models.qwen2_moe import Qwen2MoeForCausalLM
from loom.models.qwen3_moe import Qwen3MoeForCausalLM
from loom.models.seq_cls import (LlamaForSequenceClassification, Qwen2ForSequenceClassification,
                                 Qwen3ForSequenceClassification)

MODELS: dict[str, type[nn.Module]] = {
    "GemmaForCausalLM": GemmaForCausalLM,
    "ArceeForCausalLM": ArceeForCausalLM,
    "Ernie4_5ForCausalLM": Ernie4_5ForCausalLM,
    "Exaone4ForCausalLM": Exaone4ForCausalLM,
    "Gemma2ForCausalLM": Gemma2ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "Glm4ForCausalLM": Glm4ForCausalLM,
    "GraniteForCausalLM": GraniteForCausalLM,
    "GraniteMoeForCausalLM": GraniteMoeForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Olmo2ForCausalLM": Olmo2ForCausalLM,
    "Olmo3ForCausalLM": Olmo3ForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "SeedOssForCausalLM": LlamaForCausalLM,  # Llama's, with its three bias flags
    "SmolLM3ForCausalLM": SmolLM3ForCausalLM,
    # Encoders: embeddings only (`loom.models.bert`).
    "BertModel": BertModel,
    "RobertaModel": BertModel,
    "XLMRobertaModel": BertModel,
    "ModernBertModel": ModernBertModel,
    "Gemma3TextModel": Gemma3TextModel,
    "ModernBertForSequenceClassification": ModernBertForSequenceClassification,
    "BertForSequenceClassification": BertForSequenceClassification,
    "RobertaForSequenceClassification": RobertaForSequenceClassification,
    "XLMRobertaForSequenceClassification": RobertaForSequenceClassification,
    # The decoder plus a classification head (pooling only: `loom.tasks`).
    "LlamaForSequenceClassification": LlamaForSequenceClassification,
    "MistralForSequenceClassification": LlamaForSequenceClassification,
    "Qwen2ForSequenceClassification": Qwen2ForSequenceClassification,
    "Qwen3ForSequenceClassification": Qwen3ForSequenceClassification,
}


def _base_model(causal_lm: type[nn.Module]) -> type[nn.Module]:
    """The causal LM class loading a base model's checkpoint: its names lack the model.
    prefix, and it has no LM head (ModelArch ties the unused one to the embeddings)."""
    class BaseModel(causal_lm):
        def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
            return super().load_weights(
                (name if name.startswith("model.") else f"model.{name}", tensor)
                for name, tensor in weights)
    BaseModel.__name__ = BaseModel.__qualname__ = f"{causal_lm.__name__}Base"
    return BaseModel


MODELS.update({base: _base_model(MODELS[lm]) for base, lm in BASE_MODELS.items()})


def model_class(arch: ModelArch) -> type[nn.Module]:
    try:
        return MODELS[arch.architecture]
    except KeyError:
        raise ValueError(f"architecture {arch.architecture!r} is not supported; supported: "
                         f"{', '.join(sorted(MODELS))}") from None
