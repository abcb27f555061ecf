"""A BERT embedding model behind `loom serve`: /v1/embeddings tokenizes as the model's own
tokenizer does ([CLS] text [SEP]) and answers what transformers computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.entrypoints.conftest import start_server

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away", "quick", "brown"]
TEXTS = ["the cat sat on the mat", "a quick brown dog ran far away", "cat"]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    import transformers as tf
    path = tmp_path_factory.mktemp("tiny-bert")
    vocab = path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tokenizer = tf.BertTokenizerFast(str(vocab))
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = tf.BertConfig(vocab_size=len(WORDS) + 5, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4,
                           max_position_embeddings=64, initializer_range=0.15)
    model = tf.BertModel(config).eval()
    model.save_pretrained(path)
    return path, tokenizer, model


def test_embeddings_of_a_bert_server(bert_dir, tmp_path):
    path, tokenizer, model = bert_dir
    server = start_server(str(path), "mp", tmp_path, extra_args=("--max-model-len", "64"))
    try:
        response = server.client().embeddings.create(model=str(path), input=TEXTS)
        for text, item in zip(TEXTS, response.data):
            ids = tokenizer(text, return_tensors="pt").input_ids
            assert ids[0, 0] == tokenizer.cls_token_id and ids[0, -1] == tokenizer.sep_token_id
            with torch.no_grad():
                cls = model(ids).last_hidden_state[0, 0]
            torch.testing.assert_close(torch.tensor(item.embedding), F.normalize(cls, dim=-1),
                                       rtol=1e-4, atol=1e-5)
        assert response.usage.prompt_tokens == sum(
            len(tokenizer(t).input_ids) for t in TEXTS)
        _bench_embeddings(server, path, tmp_path)
    finally:
        assert server.stop() == 0, server.log_tail()


def _bench_embeddings(server, path, tmp_path):
    """`loom bench serve --endpoint /v1/embeddings` against the real server: every request
    answered, the input tokens the server's usage counted."""
    import json

    from loom.cli import main
    from tests.entrypoints.conftest import API_KEY
    assert main(["bench", "serve", "--base-url", server.url, "--api-key", API_KEY,
                 "--endpoint", "/v1/embeddings", "--model", str(path), "--tokenizer", str(path),
                 "--dataset-name", "random", "--random-input-len", "8", "--num-prompts", "6",
                 "--save-result", "--result-dir", str(tmp_path),
                 "--result-filename", "bench.json"]) == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["completed"] == 6 and result["failed"] == 0
    assert all(r["success"] and r["tokens_from_usage"] and 1 < r["input_tokens"] <= 64
               for r in result["requests"])
    assert result["total_input_tokens"] == sum(r["input_tokens"] for r in result["requests"])
