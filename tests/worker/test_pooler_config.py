"""vLLM's --pooler-config: the server's pooling defaults over the model's own, each against
transformers' hidden states (or the same request with the field set explicitly)."""

from __future__ import annotations

import pytest
import torch

from loom import LLM
from loom.engine.arg_utils import EngineArgs
from loom.pooling_params import PoolingParams
from tests.worker.test_pooling import PROMPTS, hf_pooled


def _llm(path, **kwargs) -> LLM:
    return LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
               **kwargs)


def test_pooling_type_and_normalize_defaults(tiny_model_factory):
    path, hf = tiny_model_factory("llama")
    llm = _llm(path, pooler_config={"pooling_type": "MEAN", "normalize": False})
    try:
        outs = llm.embed(PROMPTS, use_tqdm=False)
        for prompt, out in zip(PROMPTS, outs):
            torch.testing.assert_close(torch.tensor(out.outputs.embedding),
                                       hf_pooled(hf, prompt, "mean", normalize=False),
                                       atol=1e-4, rtol=1e-4)
        # a request's own normalize wins
        own = llm.embed(PROMPTS[:1], PoolingParams(normalize=True), use_tqdm=False)[0]
        torch.testing.assert_close(torch.tensor(own.outputs.embedding),
                                   hf_pooled(hf, PROMPTS[0], "mean"), atol=1e-4, rtol=1e-4)
    finally:
        llm.shutdown()


def test_default_dimensions_of_a_matryoshka_model(tiny_model_factory):
    path, hf = tiny_model_factory("llama")
    llm = _llm(path, pooler_config={"dimensions": 16}, hf_overrides={"is_matryoshka": True})
    try:
        out = llm.embed(PROMPTS[:1], use_tqdm=False)[0]
        last = hf_pooled(hf, PROMPTS[0], "last", normalize=False)
        torch.testing.assert_close(torch.tensor(out.outputs.embedding),
                                   torch.nn.functional.normalize(last[:16], dim=-1),
                                   atol=1e-4, rtol=1e-4)
    finally:
        llm.shutdown()


def test_use_activation_default_of_a_classifier(tmp_path):
    from tests.conftest import make_tiny_classifier
    path = str(tmp_path / "cls")
    make_tiny_classifier("llama", path, num_labels=3)
    outs = {}
    for default in (True, False):
        llm = _llm(path, pooler_config={"use_activation": default})
        try:
            outs[default] = llm.classify([{"prompt_token_ids": PROMPTS[0]}],
                                         use_tqdm=False)[0].outputs.probs
        finally:
            llm.shutdown()
    assert sum(outs[True]) == pytest.approx(1.0)  # softmax over the labels
    assert torch.allclose(torch.tensor(outs[True]), torch.tensor(outs[False]).softmax(-1),
                          atol=1e-6)


@pytest.mark.parametrize("config, message", [
    ({"pooling_type": "ALL"}, "pooler_config.pooling_type: 'ALL' is not one of CLS, LAST, MEAN"),
    ({"step_tag_id": 5}, "pooler_config.step_tag_id: not a field loom applies"),
    ({"dimensions": 0}, "pooler_config.dimensions: must be a positive integer"),
    ({"normalize": "yes"}, "pooler_config.normalize: must be true or false"),
])
def test_bad_pooler_configs_are_named(config, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(model="llama-3.1-8b", load_format="dummy",
                   pooler_config=config).create_engine_config()


def test_dimensions_default_needs_a_matryoshka_model(tiny_model_factory):
    path, _ = tiny_model_factory("llama")
    with pytest.raises(ValueError, match="pooler_config.dimensions: LlamaForCausalLM does not "
                                         "support reduced"):
        _llm(path, pooler_config={"dimensions": 16})


def test_the_older_flag_name_and_both_at_once():
    import argparse
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model", "llama-3.1-8b", "--load-format", "dummy",
                            "--override-pooler-config", '{"normalize": false}'])
    config = EngineArgs.from_cli_args(ns).create_engine_config()
    assert config.model.pooler_config == {"normalize": False}
    with pytest.raises(ValueError, match="override_pooler_config: --pooler-config is its newer "
                                         "name; give one of them"):
        EngineArgs(model="llama-3.1-8b", load_format="dummy", pooler_config={},
                   override_pooler_config={"normalize": False}).create_engine_config()
