"""Encoder embedding models (BertModel, XLMRobertaModel) against transformers on tiny random
models (float32): the pooled vector a sentence-transformers model would compute from
transformers' last hidden states, per request, in mixed batches."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from loom import LLM
from loom.pooling_params import PoolingParams

TINY_ENCODER = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, max_position_embeddings=128,
                    initializer_range=0.15)


def _make(kind: str, path: Path, pooling: str | None = None):
    import transformers as tf
    torch.manual_seed(0)
    if kind == "bert":
        config = tf.BertConfig(**TINY_ENCODER, type_vocab_size=2, hidden_act="gelu")
        model = tf.BertModel(config, add_pooling_layer=True)
    else:  # XLM-R: positions from pad + 1, one token type, tanh-approximated gelu
        config = tf.XLMRobertaConfig(**TINY_ENCODER, type_vocab_size=1, pad_token_id=1,
                                     hidden_act="gelu_new")
        model = tf.XLMRobertaModel(config, add_pooling_layer=False)
    model.eval().save_pretrained(path)
    if pooling is not None:
        _make_pooling(path, pooling)
    return model


def _make_pooling(path: Path, pooling: str) -> None:
    """A sentence-transformers directory's modules.json and its Pooling module's config."""
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"}]))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 64, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False}))


def _prompts(lengths=(5, 17, 40, 3, 100, 64)) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, 256) for _ in range(n)] for n in lengths]


def _reference(model, prompt: list[int], pooling: str) -> torch.Tensor:
    with torch.no_grad():
        hidden = model(torch.tensor([prompt])).last_hidden_state[0]
    pooled = hidden[0] if pooling == "cls" else hidden.mean(dim=0)
    return F.normalize(pooled, dim=-1)


@pytest.mark.parametrize("kind, pooling", [("bert", None), ("bert", "mean"),
                                           ("xlm-roberta", "cls"), ("xlm-roberta", "mean")])
def test_embeddings_match_transformers(tmp_path, kind, pooling):
    model = _make(kind, tmp_path, pooling)
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, dtype="float32", device="cpu",
              max_num_batched_tokens=160)  # several steps, each prompt whole
    prompts = _prompts()
    outs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    pooling = pooling or "cls"  # BERT's default: the [CLS] token's state
    for prompt, out in zip(prompts, outs):
        torch.testing.assert_close(torch.tensor(out.outputs.embedding),
                                   _reference(model, prompt, pooling), rtol=1e-4, atol=1e-5)
    # The other pooling differs past the tolerance: the comparison can fail.
    other = _reference(model, prompts[2], "mean" if pooling == "cls" else "cls")
    assert not torch.allclose(torch.tensor(outs[2].outputs.embedding), other, atol=1e-3)
    llm.shutdown()


def test_xlm_roberta_context_and_refusals(tmp_path):
    _make("xlm-roberta", tmp_path)
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, dtype="float32", device="cpu")
    # 128 positions, counted from pad + 1 = 2: 126 tokens
    assert llm.engine.max_model_len == 126
    with pytest.raises(ValueError, match="generate"):
        llm.generate([{"prompt_token_ids": [5, 6]}], use_tqdm=False)
    llm.shutdown()


@pytest.mark.parametrize("kwargs, message", [
    ({"runner": "generate"}, "runner: BertModel is an encoder"),
    ({"tensor_parallel_size": 2}, "tensor_parallel_size: BertModel .an encoder. runs on one "
                                  "device"),
    ({"enable_lora": True}, "enable_lora: encoder"),
    ({"max_num_batched_tokens": 64, "max_num_seqs": 64},
     "max_num_batched_tokens: an encoder runs each prompt in one step"),
])
def test_encoder_refusals(tmp_path, kwargs, message):
    _make("bert", tmp_path)
    with pytest.raises(ValueError, match=message):
        LLM(str(tmp_path), skip_tokenizer_init=True, dtype="float32", device="cpu", **kwargs)


def test_unsupported_sentence_transformers_pooling_is_named(tmp_path):
    _make("bert", tmp_path, "mean")
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_max_tokens": True}))
    with pytest.raises(ValueError, match=r"1_Pooling/config.json: pooling modes "
                                         r"\['pooling_mode_max_tokens'\]"):
        LLM(str(tmp_path), skip_tokenizer_init=True, dtype="float32", device="cpu")


def test_request_pooling_type_yields_to_the_models(tmp_path):
    model = _make("bert", tmp_path, "mean")
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, dtype="float32", device="cpu")
    prompt = _prompts()[1]
    out = llm.embed([{"prompt_token_ids": prompt}], PoolingParams(pooling_type="last"),
                    use_tqdm=False)[0]
    torch.testing.assert_close(torch.tensor(out.outputs.embedding),
                               _reference(model, prompt, "mean"), rtol=1e-4, atol=1e-5)
    llm.shutdown()


WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away"]


def _word_piece(path: Path):
    """A BERT WordPiece tokenizer over a few words, saved beside the model."""
    import transformers as tf
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                               *WORDS]) + "\n")
    tokenizer = tf.BertTokenizerFast(str(path / "vocab.txt"))
    tokenizer.save_pretrained(path)
    return tokenizer


@pytest.mark.parametrize("kind", ["xlm-roberta", "bert", "modernbert-cls", "modernbert-mean"])
def test_cross_encoders_score_as_transformers(tmp_path, kind):
    """XLMRobertaForSequenceClassification (bge-reranker's layout) and
    BertForSequenceClassification (ms-marco-MiniLM's: its pooler, and the pair's second text
    of token type 1), one label: the head reads the first token; a score is the logit
    through sigmoid, the pair run as one sequence."""
    import transformers as tf
    torch.manual_seed(0)
    tokenizer = _word_piece(tmp_path)
    common = dict(TINY_ENCODER, vocab_size=len(WORDS) + 5)
    if kind == "bert":
        model = tf.BertForSequenceClassification(tf.BertConfig(**common, num_labels=1))
    elif kind.startswith("modernbert"):  # gte-reranker-modernbert's layout: mean pooling
        model = tf.ModernBertForSequenceClassification(tf.ModernBertConfig(
            **{k: v for k, v in common.items() if k != "hidden_act"}, local_attention=8,
            num_labels=1, pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2,
            sep_token_id=3, classifier_pooling=kind.split("-")[1]))
    else:
        model = tf.XLMRobertaForSequenceClassification(tf.XLMRobertaConfig(
            **common, type_vocab_size=1, pad_token_id=0, num_labels=1))
    model.eval().save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", device="cpu")
    query, docs = "the cat sat", ["a dog ran far away", "the cat sat on the mat", "mat"]
    scores = [s.outputs.score for s in llm.score(query, docs, use_tqdm=False)]
    for doc, score in zip(docs, scores):
        encoded = tokenizer(query, doc, return_tensors="pt")
        types = encoded.token_type_ids if kind == "bert" else None  # XLM-R has one type
        assert kind != "bert" or types[0, -1] == 1
        with torch.no_grad():
            logit = model(encoded.input_ids, token_type_ids=types).logits[0, 0]
            untyped = model(encoded.input_ids).logits[0, 0]
        assert score == pytest.approx(torch.sigmoid(logit).item(), rel=1e-4, abs=1e-6)
        if kind == "bert":  # the token types move the reference past the tolerance
            assert abs(torch.sigmoid(untyped) - torch.sigmoid(logit)) > 1e-3
    assert max(scores) - min(scores) > 1e-3  # the documents are told apart
    llm.shutdown()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_modernbert_embeddings_match_transformers(tmp_path, pooling):
    """Two local layers (a 16-token window: 8 either way, shorter than most prompts) between
    global ones, two rotary bases."""
    import transformers as tf
    torch.manual_seed(0)
    config = tf.ModernBertConfig(vocab_size=256, hidden_size=64, intermediate_size=96,
                                 num_hidden_layers=4, num_attention_heads=4,
                                 max_position_embeddings=128, local_attention=16,
                                 pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                 cls_token_id=1, sep_token_id=2, initializer_range=0.15)
    model = tf.ModernBertModel(config).eval()
    for name, param in model.named_parameters():  # norms start at one: random ones test them
        if "norm" in name:
            param.data.normal_(1.0, 0.3)
    model.save_pretrained(tmp_path)
    _make_pooling(tmp_path, pooling)
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, dtype="float32", device="cpu")
    prompts = _prompts()
    outs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        torch.testing.assert_close(torch.tensor(out.outputs.embedding),
                                   _reference(model, prompt, pooling), rtol=1e-4, atol=1e-5)
    llm.shutdown()


def _dense_module(path: Path, name: str, weight: torch.Tensor, bias: torch.Tensor | None,
                  activation: str) -> dict:
    from safetensors.torch import save_file
    (path / name).mkdir()
    (path / name / "config.json").write_text(json.dumps({
        "in_features": weight.shape[1], "out_features": weight.shape[0],
        "bias": bias is not None, "activation_function": activation}))
    tensors = {"linear.weight": weight} | ({"linear.bias": bias} if bias is not None else {})
    save_file(tensors, str(path / name / "model.safetensors"))
    return {"idx": 2, "name": name, "path": name, "type": "sentence_transformers.models.Dense"}


def test_embedding_gemma_matches_transformers(tmp_path):
    """EmbeddingGemma's layout: Gemma 3 attending both ways (its local layers within the
    window either side), mean pooling, then sentence-transformers Dense modules."""
    check_embedding_gemma(tmp_path, "cpu")


def check_embedding_gemma(tmp_path: Path, device: str, **kwargs) -> None:
    import transformers as tf
    from tests.conftest import TINY
    torch.manual_seed(0)
    config = tf.Gemma3TextConfig(**dict(TINY, num_hidden_layers=6), pad_token_id=0,
                                 sliding_window=8, query_pre_attn_scalar=16,
                                 use_bidirectional_attention=True)
    config.architectures = ["Gemma3TextModel"]
    model = tf.Gemma3TextModel(config).eval()
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.data.normal_(0.0, 0.3)
    model.save_pretrained(tmp_path)
    _make_pooling(tmp_path, "mean")
    up, up_bias, down = torch.randn(96, 64) * 0.2, torch.randn(96) * 0.1, torch.randn(64, 96) * 0.2
    modules = json.loads((tmp_path / "modules.json").read_text())
    modules += [_dense_module(tmp_path, "2_Dense", up, up_bias,
                              "torch.nn.modules.activation.Tanh"),
                _dense_module(tmp_path, "3_Dense", down, None,
                              "torch.nn.modules.linear.Identity")]
    modules[-1]["idx"] = 3
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, dtype="float32", device=device, **kwargs)
    prompts = _prompts((5, 17, 40, 3))
    outs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            pooled = model(torch.tensor([prompt])).last_hidden_state[0].mean(dim=0)
        expected = F.normalize(down @ torch.tanh(up @ pooled + up_bias), dim=-1)
        torch.testing.assert_close(torch.tensor(out.outputs.embedding), expected,
                                   rtol=1e-4, atol=1e-5)
    llm.shutdown()


def test_matryoshka_dimensions(tmp_path):
    """vLLM's `dimensions` for a matryoshka model: the pooled vector's leading values, then
    normalised; refused by name for a model that is not one, a size it does not list, or
    more than the embedding has."""
    model = _make("bert", tmp_path)
    prompt = _prompts()[2]
    with torch.no_grad():
        cls = model(torch.tensor([prompt])).last_hidden_state[0, 0]
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, dtype="float32", device="cpu",
              hf_overrides={"is_matryoshka": True})
    out = llm.embed([{"prompt_token_ids": prompt}], PoolingParams(dimensions=16),
                    use_tqdm=False)[0]
    torch.testing.assert_close(torch.tensor(out.outputs.embedding),
                               F.normalize(cls[:16], dim=-1), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"dimensions: 65 is more than the model's embedding "
                                         r"has \(64\)"):
        llm.embed([{"prompt_token_ids": prompt}], PoolingParams(dimensions=65), use_tqdm=False)
    llm.shutdown()
    listed = LLM(str(tmp_path), skip_tokenizer_init=True, dtype="float32", device="cpu",
                 hf_overrides={"matryoshka_dimensions": [16, 32]})
    with pytest.raises(ValueError, match=r"dimensions: 24 is not one of the model's "
                                         r"matryoshka dimensions \[16, 32\]"):
        listed.embed([{"prompt_token_ids": prompt}], PoolingParams(dimensions=24),
                     use_tqdm=False)
    listed.shutdown()
    plain = LLM(str(tmp_path), skip_tokenizer_init=True, dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="dimensions: BertModel does not support reduced"):
        plain.embed([{"prompt_token_ids": prompt}], PoolingParams(dimensions=16),
                    use_tqdm=False)
    plain.shutdown()
    with pytest.raises(ValueError, match="dimensions: must be a positive integer"):
        PoolingParams(dimensions=0)


def test_truncation_keeps_the_encoders_special_tokens(tmp_path):
    """truncate_prompt_tokens cuts a text from the left inside its [CLS] ... [SEP], as the
    tokenizer's own left truncation (vLLM's) does: the [CLS] an encoder pools stays."""
    tokenizer = _word_piece(tmp_path)
    model = _make("bert", tmp_path)  # (its vocabulary covers the WordPiece ids)
    llm = LLM(str(tmp_path), dtype="float32", device="cpu")
    text = "the cat sat on the mat a dog ran far away"
    out = llm.embed([text], PoolingParams(truncate_prompt_tokens=5), use_tqdm=False)[0]
    tokenizer.truncation_side = "left"
    ids = tokenizer(text, truncation=True, max_length=5).input_ids
    assert out.prompt_token_ids == ids and ids[0] == tokenizer.cls_token_id
    with torch.no_grad():
        cls = model(torch.tensor([ids])).last_hidden_state[0, 0]
    torch.testing.assert_close(torch.tensor(out.outputs.embedding), F.normalize(cls, dim=-1),
                               rtol=1e-4, atol=1e-5)
    llm.shutdown()
