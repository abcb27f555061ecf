"""Sequence-classification models (transformers' *ForSequenceClassification, loaded through
loom's loader): `LLM.classify` equals transformers' logits and probabilities for single
prompts and padded batches (its last-non-pad-token rule included), cross-encoder `LLM.score`
equals the sigmoid of transformers' logit on the tokenizer's pair encoding, and what a
classifier does not serve is refused as vLLM refuses it."""

from __future__ import annotations

import random

import pytest
import torch

from loom import LLM, PoolingParams, SamplingParams
from loom.engine.arg_utils import EngineArgs
from loom.engine.protocol import ModelTasks
from loom.scoring import pair_token_ids
from loom.tasks import model_tasks
from tests.conftest import make_tiny_classifier

PAD = 0
PROMPTS = [[random.Random(i).randrange(3, 256) for _ in range(n)]
           for i, n in enumerate((7, 30, 19))]
QUERY = "Where do foxes sleep?"
DOCS = ["Foxes sleep in dens.", "Paris is the capital of France.", "Sleep"]
# kind -> (num_labels, config fields, the activation transformers' loss implies)
KINDS = {"llama": (3, {}, "softmax"), "qwen2": (1, {}, "sigmoid"),
         "qwen3": (2, {"problem_type": "multi_label_classification"}, "sigmoid")}


def hf_logits(model, prompts: list[list[int]]) -> torch.Tensor:
    """transformers' logits for a batch, right-padded with the pad token."""
    width = max(map(len, prompts))
    ids = torch.tensor([p + [PAD] * (width - len(p)) for p in prompts])
    with torch.no_grad():
        return model(ids, attention_mask=(ids != PAD).long()).logits.float()


@pytest.fixture(scope="module", params=list(KINDS))
def classifier(request, tmp_path_factory):
    labels, config, activation = KINDS[request.param]
    path = str(tmp_path_factory.mktemp(f"{request.param}-cls"))
    hf = make_tiny_classifier(request.param, path, labels, **config)
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
              max_num_batched_tokens=12, block_size=4)
    yield llm, hf, activation
    llm.shutdown()


def test_classify_matches_transformers(classifier):
    llm, hf, activation = classifier
    expected = hf_logits(hf, PROMPTS)  # one padded batch: each row's last non-pad token
    act = (lambda x: x.softmax(-1)) if activation == "softmax" else torch.sigmoid
    outs = llm.classify(PROMPTS, use_tqdm=False)
    raw = llm.classify(PROMPTS, pooling_params=PoolingParams(use_activation=False),
                       use_tqdm=False)
    for i, prompt in enumerate(PROMPTS):
        assert outs[i].prompt_token_ids == prompt and outs[i].finished
        assert outs[i].outputs.num_classes == hf.config.num_labels
        torch.testing.assert_close(torch.tensor(raw[i].outputs.probs), expected[i],
                                   atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(torch.tensor(outs[i].outputs.probs, dtype=torch.float32),
                                   act(expected[i]), atol=1e-5, rtol=1e-4)
    alone = llm.classify(PROMPTS[1], use_tqdm=False)[0]  # its own batch: the same
    assert alone.outputs.probs == pytest.approx(outs[1].outputs.probs, abs=1e-6)


def test_classify_reads_the_last_non_pad_token(classifier):
    """transformers skips trailing pad tokens (pad == eos in many checkpoints); a prompt
    that is all pad is read at its first token. Twice: the second run hits the prefix cache."""
    llm, hf, _ = classifier
    padded = [PROMPTS[0] + [PAD, PAD], [PAD, PAD, PAD]]
    with torch.no_grad():
        expected = [hf(torch.tensor([p])).logits[0] for p in padded]
    torch.testing.assert_close(expected[0], hf_logits(hf, PROMPTS[:1])[0])
    params = PoolingParams(use_activation=False)
    for _ in range(2):
        outs = llm.classify(padded, pooling_params=params, use_tqdm=False)
        for out, prompt, logits in zip(outs, padded, expected):
            assert out.prompt_token_ids == prompt  # as sent: usage counts every token
            torch.testing.assert_close(torch.tensor(out.outputs.probs), logits, atol=1e-4,
                                       rtol=1e-4)


def test_what_a_classifier_does_not_serve_is_refused(classifier):
    llm, hf, _ = classifier
    calls = {"LLM.generate()": lambda: llm.generate(PROMPTS[0], SamplingParams(max_tokens=2)),
             "LLM.beam_search()": lambda: llm.beam_search(PROMPTS[:1], None),
             "LLM.embed()": lambda: llm.embed(PROMPTS[0])}
    for api, call in calls.items():
        with pytest.raises(ValueError, match=rf"^The model does not support {api}\(\): "):
            call()
    if hf.config.num_labels != 1:  # vLLM's condition for cross-encoder scoring
        with pytest.raises(ValueError, match="Score API is only enabled for num_labels == 1"):
            llm.score(PROMPTS[0], PROMPTS[1])
    with pytest.raises(ValueError, match="pooling_type"):
        llm.classify(PROMPTS[0], pooling_params=PoolingParams(pooling_type="mean"))
    assert llm.classify(PROMPTS[0], use_tqdm=False)  # and the engine still serves


def test_encode_is_classify_as_a_tensor(classifier):
    """vLLM's LLM.encode: a classifier's own task is classify; the data is transformers'
    logits through the activation (or raw) as a float32 tensor."""
    llm, hf, activation = classifier
    expected = hf_logits(hf, PROMPTS)
    act = (lambda x: x.softmax(-1)) if activation == "softmax" else torch.sigmoid
    outs = llm.encode(PROMPTS, use_tqdm=False)
    raw = llm.encode(PROMPTS, PoolingParams(use_activation=False), pooling_task="classify",
                     use_tqdm=False)
    for i, prompt in enumerate(PROMPTS):
        assert outs[i].prompt_token_ids == prompt and outs[i].outputs.data.dtype == torch.float32
        torch.testing.assert_close(outs[i].outputs.data, act(expected[i]), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(raw[i].outputs.data, expected[i], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match=r"does not support LLM.encode\(\)"):
        llm.encode(PROMPTS[0], pooling_task="embed")


@pytest.fixture(scope="module")
def cross_encoder(tiny_cross_encoder):
    path, hf, hf_tok = tiny_cross_encoder
    llm = LLM(path, dtype="float32", device="cpu", max_model_len=128)
    yield llm, hf, hf_tok
    llm.shutdown()


def test_cross_encoder_scores_the_pair_encoding(cross_encoder):
    llm, hf, hf_tok = cross_encoder
    outs = llm.score(QUERY, DOCS, use_tqdm=False)
    for doc, out in zip(DOCS, outs):
        ids = hf_tok(QUERY, text_pair=doc)["input_ids"]
        assert out.prompt_token_ids == ids and ids.count(128000) == 2  # a BOS before each
        with torch.no_grad():
            logit = hf(torch.tensor([ids])).logits[0, 0]
        assert out.outputs.score == pytest.approx(torch.sigmoid(logit).item(), abs=1e-5)
    pairwise = llm.score([QUERY, DOCS[0]], DOCS[1:], use_tqdm=False)
    assert pairwise[0].outputs.score == pytest.approx(outs[1].outputs.score, abs=1e-6)
    assert pairwise[1].prompt_token_ids == hf_tok(DOCS[0], text_pair=DOCS[2])["input_ids"]
    raw = llm.score(QUERY, DOCS[0], pooling_params=PoolingParams(use_activation=False),
                    use_tqdm=False)[0].outputs.score
    assert torch.sigmoid(torch.tensor(raw)).item() == pytest.approx(outs[0].outputs.score)
    # classify on a one-label model: the same logit through classify's sigmoid
    probs = llm.classify([outs[0].prompt_token_ids], use_tqdm=False)[0].outputs.probs
    assert probs == pytest.approx([outs[0].outputs.score], abs=1e-6)
    with pytest.raises(ValueError, match="^data_2: a cross-encoder scores text pairs"):
        llm.score(QUERY, [[1, 2, 3]])


def test_llm_as_reranker_joins_the_texts(cross_encoder):
    """use_sep_token false (vLLM's default for LLMs converted to rerankers): one text."""
    llm = cross_encoder[0]
    tasks = ModelTasks("LlamaForSequenceClassification", ["classify", "score"], ["LABEL_0"],
                       use_sep_token=False)
    assert pair_token_ids(llm.tokenizer, tasks, QUERY, DOCS[0]) == \
        llm.tokenizer.encode(QUERY + DOCS[0])


def test_model_tasks_from_config():
    cls = {"architectures": ["Qwen2ForSequenceClassification"]}
    assert model_tasks(cls).tasks == ["classify"]  # transformers' default: two labels
    one = model_tasks({**cls, "id2label": {"0": "relevant"}, "pad_token_id": 5})
    assert (one.tasks, one.labels, one.pad_token_id) == (["classify", "score"], ["relevant"], 5)
    assert (one.classify_activation, one.score_activation) == ("sigmoid", "sigmoid")
    identity = {**cls, "num_labels": 1, "sentence_transformers": {
        "activation_fn": "torch.nn.modules.linear.Identity"}, "problem_type": "regression"}
    assert model_tasks(identity).score_activation == "identity"
    assert model_tasks(identity).classify_activation == "identity"
    with pytest.raises(ValueError, match="^sentence_transformers.activation_fn: "):
        model_tasks({**cls, "sentence_transformers": {"activation_fn": "os.system"}})
    causal = {"architectures": ["LlamaForCausalLM"]}
    assert model_tasks(causal).tasks == ["generate", "embed"]
    assert model_tasks(causal, "generate").tasks == ["generate"]
    assert model_tasks(causal, "pooling").tasks == model_tasks(causal, convert="embed").tasks \
        == ["embed"]
    for runner, convert, flag in (("generate", "auto", "runner"), ("auto", "embed", "convert")):
        with pytest.raises(ValueError, match=f"^{flag}: "):
            model_tasks(cls, runner, convert)
    with pytest.raises(ValueError, match="^convert: 'classify' needs a classification head"):
        model_tasks(causal, convert="classify")


def test_vllm_task_flag_maps_onto_runner_and_convert():
    for task, runner, convert in (("embed", "pooling", "embed"), ("score", "pooling", "classify"),
                                  ("generate", "generate", "auto")):
        model = EngineArgs(model="llama-3.1-8b", task=task).create_engine_config().model
        assert (model.runner, model.convert) == (runner, convert)
    with pytest.raises(ValueError, match="^task: "):
        EngineArgs(model="llama-3.1-8b", task="reward").create_engine_config()


def test_causal_lm_under_runner_pooling_only_embeds(tiny_model_factory):
    path, _ = tiny_model_factory("llama")
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=64,
              runner="pooling")
    try:
        assert llm.embed(PROMPTS[0], use_tqdm=False)[0].outputs.embedding
        with pytest.raises(ValueError, match="--runner auto or generate to generate"):
            llm.generate(PROMPTS[0])
        with pytest.raises(ValueError, match="LLM.classify"):
            llm.classify(PROMPTS[0])
    finally:
        llm.shutdown()


def test_tensor_parallel_classifier_matches_transformers(tmp_path):
    """TP=2 on gloo: the decoder split across two ranks, the head over the gathered hidden
    state, gives transformers' logits."""
    path = str(tmp_path / "cls")
    hf = make_tiny_classifier("llama", path, 3)
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
              tensor_parallel_size=2)
    try:
        raw = llm.classify(PROMPTS, pooling_params=PoolingParams(use_activation=False),
                           use_tqdm=False)
    finally:
        llm.shutdown()
    expected = hf_logits(hf, PROMPTS)
    for i in range(len(PROMPTS)):
        torch.testing.assert_close(torch.tensor(raw[i].outputs.probs), expected[i], rtol=1e-4,
                                   atol=1e-5)
