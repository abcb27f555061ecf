"""Encoder-only models: BERT (BertModel: bge, e5, all-MiniLM, ...) and RoBERTa / XLM-RoBERTa
(multilingual-e5, bge-m3, ...) embedders, and their classifiers (cross-encoders such as
ms-marco-MiniLM and bge-reranker), as transformers computes them.

Each layer attends both ways within its request: every request's whole prompt runs in one
step (the scheduler never chunks an encoder's prompt), so its keys are the step's own rows,
and nothing is kept in a KV cache. Post-norm layers (LayerNorm after each residual sum),
learned absolute positions (RoBERTa's counted from padding_idx + 1) and a token type
embedding (type 0, but for a BERT cross-encoder's second text). The pooled vector is a row
of the last layer's output or their mean (`loom.worker.pooler`), as the model's
sentence-transformers config says; a classifier's head reads the first row.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from loom.forward_context import get_forward_context
from loom.models.arch import ModelArch

_PREFIXES = ("bert.", "roberta.", "model.")
_SKIPPED = ("cls.", "lm_head.", "embeddings.position_ids", "embeddings.token_type_ids")
"""The MLM head and buffers."""


ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": functools.partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
    "gelu_fast": functools.partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
}
"""transformers' ACT2FN names -> the same function (gelu_new and gelu_fast are tanh's
approximation of gelu, as written out)."""


class EncoderLayer(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        h, eps = arch.hidden_size, arch.rms_norm_eps
        self.num_heads, self.head_dim = arch.num_heads, arch.head_dim
        self.query, self.key, self.value = (nn.Linear(h, h) for _ in range(3))
        self.attention_output = nn.Linear(h, h)
        self.attention_norm = nn.LayerNorm(h, eps=eps)
        self.intermediate = nn.Linear(h, arch.intermediate_size)
        self.output = nn.Linear(arch.intermediate_size, h)
        self.output_norm = nn.LayerNorm(h, eps=eps)
        self.act = ACTIVATIONS.get(arch.hidden_act)
        if self.act is None:
            raise ValueError(f"hidden_act: {arch.hidden_act!r} is not one loom's encoders "
                             f"apply ({', '.join(ACTIVATIONS)})")

    def forward(self, x: torch.Tensor, segments: Segments) -> torch.Tensor:
        heads = [segments.pad(p(x).view(-1, self.num_heads, self.head_dim))
                 for p in (self.query, self.key, self.value)]
        attended = F.scaled_dot_product_attention(*heads, attn_mask=segments.mask)
        x = self.attention_norm(x + self.attention_output(segments.unpad(attended)))
        return self.output_norm(x + self.output(self.act(self.intermediate(x))))


class Segments:
    """The step's requests as a padded batch [requests, heads, longest, head_dim], each
    attending to its own rows only, and back."""

    def __init__(self, starts: list[int], device: torch.device) -> None:
        lengths = [b - a for a, b in zip(starts, starts[1:])]
        longest = max(lengths)
        offsets = torch.arange(longest, device=device)
        begin = torch.tensor(starts[:-1], device=device)[:, None]
        valid = offsets[None, :] < torch.tensor(lengths, device=device)[:, None]
        self.index = torch.where(valid, begin + offsets[None, :], 0)
        self.valid = valid
        self.mask = valid[:, None, None, :]  # keys a query may see: its request's

    def within(self, window: int) -> torch.Tensor:
        """The mask of a layer whose tokens see only those at most `window` away."""
        offsets = torch.arange(self.index.shape[1], device=self.index.device)
        near = (offsets[:, None] - offsets[None, :]).abs() <= window
        return self.mask & near

    def pad(self, rows: torch.Tensor) -> torch.Tensor:
        return rows[self.index].transpose(1, 2)

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        return padded.transpose(1, 2)[self.valid].flatten(1)


class BertModel(nn.Module):
    is_encoder = True
    """Whole prompts, both-ways attention, no KV cache (`loom.engine.core`)."""
    sep_token_id: int | None = None
    """A BERT cross-encoder's: its pairs' tokens after the first [SEP] are of type 1, as
    the tokenizer's pair encoding types them; None: every token is of type 0."""
    uses_pooler = False
    """BERT's pooler (dense and tanh on [CLS]) is a classifier's, not an embedder's."""

    def __init__(self, arch: ModelArch, max_model_len: int | None = None) -> None:
        super().__init__()
        self.arch = arch
        h = arch.hidden_size
        self.word_embeddings = nn.Embedding(arch.vocab_size, h)
        self.position_embeddings = nn.Embedding(arch.max_position_embeddings, h)
        self.token_type_embeddings = nn.Embedding(max(arch.type_vocab_size, 1), h)
        self.embeddings_norm = nn.LayerNorm(h, eps=arch.rms_norm_eps)
        self.layers = nn.ModuleList(EncoderLayer(arch) for _ in range(arch.num_layers))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        segments, n = segments_of_step(input_ids.shape[0], self.arch.context_len,
                                       input_ids.device)
        x = (self.word_embeddings(input_ids)
             + self.position_embeddings(positions + self.arch.position_offset))
        types = self._token_types(input_ids[:n], segments)
        x = self.embeddings_norm(x + (self.token_type_embeddings.weight[0] if types is None
                                      else F.pad(self.token_type_embeddings(types),
                                                 (0, 0, 0, x.shape[0] - n))))
        hidden = x[:n]
        for layer in self.layers:
            hidden = layer(hidden, segments)
        return torch.cat([hidden, x[n:]]) if n < x.shape[0] else hidden

    def _token_types(self, input_ids: torch.Tensor, segments: Segments) -> torch.Tensor | None:
        if self.sep_token_id is None:
            return None
        sep = (input_ids[segments.index] == self.sep_token_id) & segments.valid
        after_first = (sep.cumsum(dim=1) - sep.int()) > 0
        return after_first[segments.valid].long()

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """No LM head: what the runner's profile would read is the hidden state itself."""
        return hidden

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_encoder_weights(self, weights, lambda n: _our_name(n, self.uses_pooler))


def load_encoder_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                         our_name) -> set[str]:
    """Copy each checkpoint tensor (our_name: its name -> the parameter's, None to skip it)
    into its parameter; ValueError for one with no place, a wrong shape, or a parameter
    left unfilled."""
    params = dict(model.named_parameters())
    architecture = model.arch.architecture
    loaded = set()
    for name, tensor in weights:
        ours = our_name(name)
        if ours is None:
            continue
        if ours not in params:
            raise ValueError(f"checkpoint tensor {name!r} has no place in {architecture}")
        param = params[ours]
        if param.shape != tensor.shape:
            raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}; "
                             f"the config makes {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(tensor)
        loaded.add(ours)
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} of {architecture}'s tensors, "
                         f"e.g. {missing[0]!r}")
    return loaded


def segments_of_step(n: int, longest: int, device: torch.device) -> tuple[Segments, int]:
    """This step's requests (the forward context's), or for a profiling run requests of
    the longest length; and how many rows are real."""
    metadata = get_forward_context().attn_metadata
    if metadata is None:
        starts = list(range(0, n, longest)) + [n]
    else:
        starts = metadata.query_start_loc_cpu.tolist()
        n = starts[-1]
    return Segments(starts, device), n


class _TanhHeadClassifier(BertModel):
    """The encoder, then a head on the first token: dense, tanh, and a linear map to the
    labels (BERT's pooler and classifier; RoBERTa's classifier.dense and out_proj)."""

    classify_row = 0

    def __init__(self, arch: ModelArch, max_model_len: int | None = None) -> None:
        super().__init__(arch, max_model_len)
        _check_labels(arch)
        self.head_dense = nn.Linear(arch.hidden_size, arch.hidden_size)
        self.head_out = nn.Linear(arch.hidden_size, arch.num_labels)

    def classify(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] at the first token -> [..., num_labels] logits in float32."""
        return linear32(self.head_out, torch.tanh(linear32(self.head_dense, hidden.float())))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classify(hidden)


class RobertaForSequenceClassification(_TanhHeadClassifier):
    """A RoBERTa / XLM-RoBERTa classifier (bge-reranker): classifier.dense, tanh,
    classifier.out_proj on the first token."""


class BertForSequenceClassification(_TanhHeadClassifier):
    """A BERT classifier (ms-marco-MiniLM cross-encoders): its pooler (dense and tanh on
    [CLS]), then the classifier. A pair's second text is of token type 1 (`sep_token_id`,
    which the loader sets from the tokenizer)."""

    uses_pooler = True
    needs_sep_token = True


def linear32(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A classifier head's layer in float32 (a handful of rows)."""
    return F.linear(x.float(), layer.weight.float(),
                    None if layer.bias is None else layer.bias.float())


def _check_labels(arch: ModelArch) -> None:
    if arch.num_labels < 1:
        raise ValueError(f"num_labels: {arch.architecture} needs at least one label, "
                         f"got {arch.num_labels}")


_RENAMES = (
    ("embeddings.LayerNorm.", "embeddings_norm."),
    ("embeddings.word_embeddings.", "word_embeddings."),
    ("embeddings.position_embeddings.", "position_embeddings."),
    ("embeddings.token_type_embeddings.", "token_type_embeddings."),
    ("encoder.layer.", "layers."),
    (".attention.self.", "."),
    (".attention.output.dense.", ".attention_output."),
    (".attention.output.LayerNorm.", ".attention_norm."),
    (".intermediate.dense.", ".intermediate."),
    (".output.dense.", ".output."),
    (".output.LayerNorm.", ".output_norm."),
    (".gamma", ".weight"),
    (".beta", ".bias"),
    ("classifier.dense.", "head_dense."),
    ("classifier.out_proj.", "head_out."),
    ("pooler.dense.", "head_dense."),
    ("classifier.", "head_out."),
)


def _our_name(name: str, uses_pooler: bool) -> str | None:
    """A checkpoint's name (transformers' BertModel, with or without its bert. / roberta.
    prefix) -> loom's; None for what the model does not use."""
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    if name.startswith(_SKIPPED) or name.startswith("pooler.") and not uses_pooler:
        return None
    for theirs, ours in _RENAMES:
        name = name.replace(theirs, ours)
    return name
