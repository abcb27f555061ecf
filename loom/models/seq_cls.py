"""Decoders with a classification head (transformers' *ForSequenceClassification): the same
layers as the causal LM, and instead of the LM head a `score` linear [num_labels, hidden]
without bias, read at one token of the prompt (the pooler picks which). Classifiers and
cross-encoder rerankers (num_labels 1) are built this way."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F

from loom.layers.linear import ReplicatedLinear
from loom.models.arch import ModelArch
from loom.models.llama import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM


class SequenceClassifier:
    """Mixed in before a causal LM class: its head becomes the classifier's."""

    def make_head(self, arch: ModelArch) -> None:
        if arch.num_labels < 1:
            raise ValueError(f"num_labels: {arch.architecture} needs at least one label, "
                             f"got {arch.num_labels}")
        # Every rank holds the whole (small) head; only the driver applies it.
        self.score = ReplicatedLinear(arch.hidden_size, arch.num_labels, bias=False)

    def classify(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> [..., num_labels] logits, in float32 whatever the model's dtype
        (a handful of rows: their precision costs nothing)."""
        return F.linear(hidden.float(), self.score.weight.float())

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the runner's memory profile and warm-up run where an LM head would be."""
        return self.classify(hidden)

    classifier_token_ids: list[int] = []
    """A converted reranker's classifier_from_token ids (set by the loader)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        if not self.arch.classifier_from_token:
            return super().load_weights(weights)
        return super().load_weights(self._score_from_lm_head(weights))

    def _score_from_lm_head(self, weights: Iterable[tuple[str, torch.Tensor]]
                            ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint with its LM head (the embeddings, where tied) giving the score
        head its rows (`loom.models.seq_cls_config`)."""
        head = "model.embed_tokens.weight" if self.arch.tie_word_embeddings else \
            "lm_head.weight"
        for name, tensor in weights:
            if name == head:
                rows = tensor[self.classifier_token_ids].float()
                if self.arch.classifier_method == "from_2_way_softmax":
                    rows = rows[1:2] - rows[0:1]
                yield "score.weight", rows
            if name != "lm_head.weight":
                yield name, tensor


class LlamaForSequenceClassification(SequenceClassifier, LlamaForCausalLM):
    pass


class Qwen2ForSequenceClassification(SequenceClassifier, Qwen2ForCausalLM):
    pass


class Qwen3ForSequenceClassification(SequenceClassifier, Qwen3ForCausalLM):
    pass
