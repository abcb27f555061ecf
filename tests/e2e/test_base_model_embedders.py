"""Decoders saved as transformers' base model (no LM head), as embedding models ship
(e5-mistral's MistralModel, bge-multilingual-gemma2's Gemma2Model): loom embeds with them
(the last token's final-norm state, normalised) as transformers computes it."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from loom import LLM
from tests.conftest import TINY


def _base_model(kind: str, path):
    import transformers as tf
    torch.manual_seed(0)
    config = {"MistralModel": lambda: tf.MistralConfig(**TINY),
              "Qwen2Model": lambda: tf.Qwen2Config(**TINY),
              "Gemma2Model": lambda: tf.Gemma2Config(**TINY, pad_token_id=0,
                                                     sliding_window=16)}[kind]()
    model = getattr(tf, kind)(config).eval()
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("kind", ["MistralModel", "Qwen2Model", "Gemma2Model"])
def test_base_model_embeddings_match_transformers(tmp_path, kind):
    model = _base_model(kind, tmp_path)
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, dtype="float32", device="cpu",
              max_model_len=256)
    assert llm.tasks.tasks == ["embed"]
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 256) for _ in range(n)] for n in (4, 19, 40)]
    outs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            last = model(torch.tensor([prompt])).last_hidden_state[0, -1]
        torch.testing.assert_close(torch.tensor(out.outputs.embedding),
                                   F.normalize(last, dim=-1), rtol=1e-4, atol=1e-5)
    llm.shutdown()


def test_base_model_cannot_generate(tmp_path):
    _base_model("MistralModel", tmp_path)
    with pytest.raises(ValueError, match="runner: MistralModel is a base model without an "
                                         "LM head"):
        LLM(str(tmp_path), skip_tokenizer_init=True, device="cpu", runner="generate")
