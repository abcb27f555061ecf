"""Guided decoding through the offline LLM: a tiny random Llama with the real Llama 3
tokenizer, so the grammar alone makes the output well formed."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from loom import LLM, SamplingParams
from loom.sampling_params import GuidedDecodingParams, StructuredOutputsParams

PROMPTS = ["The quick brown fox", "Once upon a time there"]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "ok", "n"],
          "properties": {"name": {"enum": ["ann", "bob"]}, "ok": {"type": "boolean"},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99}}}
MODES = {"greedy": dict(temperature=0.0), "seeded": dict(temperature=1.0, seed=7)}


@pytest.fixture(scope="module")
def llm(tiny_llama_with_tokenizer):
    path, _ = tiny_llama_with_tokenizer
    return LLM(path, dtype="float32", device="cpu", max_model_len=256, seed=0)


def _texts(llm: LLM, guided: GuidedDecodingParams, mode: str, max_tokens: int = 24) -> list[str]:
    params = SamplingParams(n=2, max_tokens=max_tokens, guided_decoding=guided, **MODES[mode])
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    completions = [c for out in outs for c in out.outputs]
    assert len(completions) == 4
    assert all(c.finish_reason == "stop" for c in completions), completions
    return [c.text for c in completions]


@pytest.mark.parametrize("mode", list(MODES))
def test_choice_regex_and_schema_hold(llm, mode):
    choices = ["yes", "no", "maybe so"]
    assert set(_texts(llm, GuidedDecodingParams(choice=choices), mode)) <= set(choices)
    for text in _texts(llm, GuidedDecodingParams(regex=r"\d{3}-[a-z]{2}"), mode):
        assert re.fullmatch(r"\d{3}-[a-z]{2}", text), text
    for text in _texts(llm, GuidedDecodingParams(json=json.dumps(SCHEMA)), mode):
        value = json.loads(text)
        assert set(value) == {"name", "ok", "n"}, text
        assert value["name"] in ("ann", "bob") and isinstance(value["ok"], bool)
        assert isinstance(value["n"], int) and 0 <= value["n"] <= 99


def test_grammar(llm):
    grammar = 'start: "ab" num\nnum: /[0-9]{2}/'
    for text in _texts(llm, GuidedDecodingParams(grammar=grammar), "seeded"):
        assert re.fullmatch(r"ab[0-9]{2}", text), text


def test_unguided_requests_unchanged_beside_a_guided_one(llm):
    plain = SamplingParams(temperature=1.0, seed=11, max_tokens=12, ignore_eos=True)
    alone = llm.generate(PROMPTS, plain, use_tqdm=False)
    guided = plain.clone(guided_decoding=GuidedDecodingParams(regex=r"[a-z]{30}"))
    mixed = llm.generate([PROMPTS[0], PROMPTS[1], PROMPTS[0]], [plain, guided, plain],
                         use_tqdm=False)
    assert mixed[0].outputs[0].token_ids == alone[0].outputs[0].token_ids
    assert mixed[2].outputs[0].token_ids == alone[0].outputs[0].token_ids
    assert re.fullmatch(r"[a-z]+", mixed[1].outputs[0].text)


@pytest.mark.parametrize("guided, field", [
    (dict(json='{"type": "bogus"}'), "json"),
    (dict(json="{not json"), "json"),
    (dict(regex="(ab"), "regex"),
    (dict(grammar="start: (("), "grammar"),
])
def test_bad_constraints_are_value_errors(llm, guided, field):
    with pytest.raises(ValueError, match=f"guided_decoding.{field}"):
        llm.generate(PROMPTS[:1], SamplingParams(guided_decoding=GuidedDecodingParams(**guided)),
                     use_tqdm=False)


@pytest.mark.parametrize("fields", [{}, dict(regex="a", choice=["a"]), dict(choice=[])])
def test_guided_params_need_exactly_one_constraint(fields):
    with pytest.raises(ValueError, match="guided_decoding"):
        GuidedDecodingParams(**fields)


def test_structured_outputs_is_vllms_newer_name(llm):
    choices = ["yes", "no"]
    params = SamplingParams(n=2, max_tokens=8, temperature=1.0, seed=7,
                            structured_outputs=StructuredOutputsParams(choice=choices))
    assert params.guided_decoding is params.structured_outputs
    outs = [c for out in llm.generate(PROMPTS, params, use_tqdm=False) for c in out.outputs]
    assert {c.text for c in outs} <= set(choices) and all(c.finish_reason == "stop" for c in outs)
    assert params.clone(guided_decoding=None).structured_outputs is None
    with pytest.raises(ValueError, match="structured_outputs: give it or guided_decoding"):
        SamplingParams(structured_outputs=StructuredOutputsParams(choice=choices),
                       guided_decoding=GuidedDecodingParams(regex="a"))


def test_a_pydantic_model_class_is_its_schema():
    from pydantic import BaseModel

    class Point(BaseModel):
        x: int
        label: str

    assert GuidedDecodingParams(json=Point).json == Point.model_json_schema()
    with pytest.raises(ValueError, match="guided_decoding.json: .* got int"):
        GuidedDecodingParams(json=3)


# -- json_object: any JSON object -----------------------------------------------------------
# A random model would fill a free-form string until max_tokens. This one is steered: its
# final hidden state is constant, so its logits are a fixed preference, '"' > ':' > '}' > the
# rest; among what the grammar allows it closes each string and object at once.

@pytest.fixture(scope="module")
def steered_llm(tiny_llama_with_tokenizer, tmp_path_factory):
    path, model = tiny_llama_with_tokenizer
    out = tmp_path_factory.mktemp("steered-llama")
    from loom.frontend.tokenizer import load_tokenizer
    tok = load_tokenizer(path)
    steered = _steer(model, {tok.encode(c, add_special_tokens=False)[0]: w
                             for c, w in (('"', 3.0), (":", 2.0), ("}", 1.0))})
    steered.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(path) / name, out / name)
    return LLM(str(out), dtype="float32", device="cpu", max_model_len=256, seed=0)


def _steer(model, preference: dict[int, float]):
    import copy
    model = copy.deepcopy(model)
    inner = model.model
    with torch.no_grad():
        # Dimension 0 of the residual stream: a constant no layer writes to.
        inner.embed_tokens.weight[:, 0] = 50.0
        for layer in inner.layers:
            layer.self_attn.o_proj.weight[0].zero_()
            layer.mlp.down_proj.weight[0].zero_()
        inner.norm.weight.zero_()
        inner.norm.weight[0] = 1.0
        model.lm_head.weight.zero_()
        for token_id, weight in preference.items():
            model.lm_head.weight[token_id, 0] = 5.0 * weight
    return model


@pytest.mark.parametrize("mode", list(MODES))
def test_json_object_parses(steered_llm, mode):
    for text in _texts(steered_llm, GuidedDecodingParams(json_object=True), mode, 40):
        assert isinstance(json.loads(text), dict), text

