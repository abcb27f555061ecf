"""The offline LLM API's behaviour: sampling, stops, logprobs, n, aborts and bad input."""

from __future__ import annotations

import random

import pytest
import torch

from loom import LLM, SamplingParams
from loom.engine.protocol import EngineCoreRequest

PROMPTS = ["The quick brown fox", "In a galaxy far away", "Once upon a time there"]


@pytest.fixture(scope="module")
def text_llm(tiny_llama_with_tokenizer):
    path, _ = tiny_llama_with_tokenizer
    return LLM(path, dtype="float32", device="cpu", max_model_len=256, seed=0)


@pytest.fixture(scope="module")
def hf_text_model(tiny_llama_with_tokenizer):
    return tiny_llama_with_tokenizer[1]


def test_seeded_sampling_reproducible_across_batches(text_llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    alone = text_llm.generate([PROMPTS[1]], params, use_tqdm=False)[0].outputs[0].token_ids
    unseeded = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    batch = text_llm.generate([PROMPTS[0], PROMPTS[1], PROMPTS[2]], [unseeded, params, unseeded],
                              use_tqdm=False)
    assert batch[1].outputs[0].token_ids == alone
    other = text_llm.generate([PROMPTS[1]], params.clone(seed=99), use_tqdm=False)
    assert other[0].outputs[0].token_ids != alone


def test_stop_string_cuts_exactly(text_llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    full = text_llm.generate([PROMPTS[0]], greedy, use_tqdm=False)[0].outputs[0].text
    assert len(full) > 20
    stop = full[10:14]
    expected = full[:full.index(stop)]
    out = text_llm.generate([PROMPTS[0]], greedy.clone(stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert out.text == expected
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    kept = text_llm.generate([PROMPTS[0]], greedy.clone(stop=[stop], include_stop_str_in_output=True),
                             use_tqdm=False)[0].outputs[0]
    assert kept.text == expected + stop
    assert _all_blocks_free(text_llm)


def test_stop_token_ids_and_min_tokens(text_llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    tokens = text_llm.generate([PROMPTS[2]], greedy, use_tqdm=False)[0].outputs[0].token_ids
    stop_id = tokens[5]
    first = tokens.index(stop_id)
    out = text_llm.generate([PROMPTS[2]], greedy.clone(stop_token_ids=[stop_id]),
                            use_tqdm=False)[0].outputs[0]
    assert out.token_ids == tokens[:first + 1] and out.stop_reason == stop_id
    later = text_llm.generate([PROMPTS[2]], greedy.clone(stop_token_ids=[stop_id], min_tokens=first + 2),
                              use_tqdm=False)[0].outputs[0]
    assert len(later.token_ids) >= first + 2


def test_prompt_logprobs_match_transformers(text_llm, hf_text_model):
    out = text_llm.generate([PROMPTS[0]], SamplingParams(max_tokens=1, prompt_logprobs=2),
                            use_tqdm=False)[0]
    ids = out.prompt_token_ids
    with torch.no_grad():
        ref = torch.log_softmax(hf_text_model(torch.tensor([ids])).logits[0].float(), dim=-1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    for pos in range(1, len(ids)):
        entry = out.prompt_logprobs[pos]
        assert entry[ids[pos]].logprob == pytest.approx(ref[pos - 1, ids[pos]].item(), abs=1e-4)
        top = ref[pos - 1].topk(2).indices.tolist()
        assert set(top) <= set(entry)


def test_n_completions_and_logprobs(text_llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8, logprobs=2, ignore_eos=True)
    out = text_llm.generate([PROMPTS[0]], params, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    for c in out.outputs:
        assert len(c.logprobs) == len(c.token_ids) == 8
        assert c.cumulative_logprob == pytest.approx(
            sum(lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)), abs=1e-4)


def test_abort_frees_every_block(text_llm):
    engine = text_llm.engine
    params = SamplingParams(max_tokens=100, ignore_eos=True)
    for i in range(4):
        prompt = [random.Random(i).randrange(1000, 2000) for _ in range(30 + i)]
        engine.add_request(EngineCoreRequest(f"abort-{i}", prompt, params))
    for _ in range(3):
        engine.step()
    assert not _all_blocks_free(text_llm)
    engine.abort_requests([f"abort-{i}" for i in range(4)])
    outputs = engine.step().outputs
    assert {o.request_id for o in outputs if o.finished} == {f"abort-{i}" for i in range(4)}
    assert _all_blocks_free(text_llm) and not engine.has_unfinished_requests()


def _all_blocks_free(llm: LLM) -> bool:
    kv = llm.engine.get_kv_info()
    return kv["num_free_blocks"] == kv["num_blocks"]


@pytest.mark.parametrize("make_params, field", [
    (lambda: SamplingParams(max_tokens=0), "max_tokens"),
    (lambda: SamplingParams(top_p=0.0), "top_p"),
    (lambda: SamplingParams(top_p=1.5), "top_p"),
    (lambda: SamplingParams(temperature=-1.0), "temperature"),
    (lambda: SamplingParams(n=0), "n"),
    # Types: a Struct built in Python is not type-checked by msgspec, and these failed
    # inside the engine mid-step (and broke the LLM for every later call).
    (lambda: SamplingParams(seed=1.5), "seed"),
    (lambda: SamplingParams(seed=2**70), "seed"),
    (lambda: SamplingParams(top_k=2.5), "top_k"),
    (lambda: SamplingParams(logprobs=1.5), "logprobs"),
    (lambda: SamplingParams(stop_token_ids=5), "stop_token_ids"),
    (lambda: SamplingParams(stop_token_ids=[1, "2"]), "stop_token_ids"),
    (lambda: SamplingParams(max_tokens=1.5), "max_tokens"),
    (lambda: SamplingParams(n="2"), "n"),
    (lambda: SamplingParams(temperature="hot"), "temperature"),
    (lambda: SamplingParams(stop=5), "stop"),
    (lambda: SamplingParams(guided_decoding={"regex": "a"}), "guided_decoding"),
])
def test_bad_sampling_params_name_the_field(make_params, field):
    with pytest.raises(ValueError, match=field):
        make_params()


def test_bad_prompts_rejected_and_engine_keeps_serving(text_llm):
    with pytest.raises(ValueError, match="max_model_len"):
        text_llm.generate([[5] * 300], use_tqdm=False)
    with pytest.raises(ValueError, match="vocabulary"):
        text_llm.generate([[5, 10**7]], use_tqdm=False)
    # Every bad id is named, in order, on both sides of the engine's protocol.
    with pytest.raises(ValueError, match=r"^prompt: token id\(s\) \[-2, 10000000\] outside"):
        text_llm.generate([[5, -2, 7, 10**7]], use_tqdm=False)
    with pytest.raises(ValueError, match=r"^prompt: token id\(s\) \[-1, 10000000\] outside"):
        text_llm.engine.add_request(EngineCoreRequest("y", [3, -1, 10**7], SamplingParams()))
    with pytest.raises(ValueError, match="list of token ids"):
        text_llm.generate([[5, 2.0]], use_tqdm=False)
    with pytest.raises(ValueError, match="empty"):
        text_llm.generate([[]], use_tqdm=False)
    with pytest.raises(ValueError, match="empty|no room"):
        text_llm.engine.add_request(EngineCoreRequest("x", [], SamplingParams()))
    # More logprobs than the vocabulary has tokens: refused, not a sampler error that broke
    # (or, for prompt_logprobs, hung) every later call.
    for name in ("logprobs", "prompt_logprobs"):
        with pytest.raises(ValueError, match=name):
            text_llm.generate(PROMPTS[:1], SamplingParams(**{name: 10**6}), use_tqdm=False)
    out = text_llm.generate(PROMPTS[:1], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3


def test_bad_models_are_clear_value_errors(tmp_path, tiny_model_factory):
    import json
    import shutil
    path, _ = tiny_model_factory("llama")
    bad = tmp_path / "bad-arch"
    shutil.copytree(path, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["architectures"] = ["FancyNewForCausalLM"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="FancyNewForCausalLM.*supported.*LlamaForCausalLM"):
        LLM(str(bad), skip_tokenizer_init=True, device="cpu")
    for f in bad.glob("*.safetensors"):
        f.unlink()
    cfg["architectures"] = ["LlamaForCausalLM"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="safetensors"):
        LLM(str(bad), skip_tokenizer_init=True, device="cpu")
    with pytest.raises(ValueError, match="not a model directory"):
        LLM(str(tmp_path / "nowhere"), skip_tokenizer_init=True, device="cpu")


TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>"
            "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.mark.parametrize("messages", ["hi", ["hi"], {"role": "user", "content": "hi"}, None, [],
                                      [{"role": "user", "content": 5}], [{"content": "hi"}]],
                         ids=["str", "list-of-str", "dict", "none", "empty", "int-content",
                              "no-role"])
def test_chat_refuses_what_is_not_a_conversation(text_llm, messages):
    # A string was iterated character by character into empty conversations.
    with pytest.raises(ValueError, match="messages"):
        text_llm.chat(messages, SamplingParams(max_tokens=2), use_tqdm=False,
                      chat_template=TEMPLATE)


def test_chat_joins_text_parts_as_the_server_does(text_llm):
    """By newlines, as vLLM hands a string-content template its text parts."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "hel"},
                                          {"type": "text", "text": "lo"}]}]
    plain = [{"role": "user", "content": "hel\nlo"}]
    assert (text_llm.chat_prompt_ids(parts, TEMPLATE) == text_llm.chat_prompt_ids(plain, TEMPLATE)
            == text_llm.tokenizer.encode("<user>hel\nlo</user><assistant>",
                                         add_special_tokens=False))


def test_chat_template_content_format(text_llm):
    """vLLM's LLM.chat(chat_template_content_format=): "openai" hands the template the
    content as a list of text parts, "string" as one string, "auto" what the template
    reads (this one iterates the parts); anything else is a ValueError naming the field."""
    template = ("{% for m in messages %}{% if m['content'] is string %}S:{{ m['content'] }}"
                "{% else %}P:{% for p in m['content'] %}{{ p['text'] }}|{% endfor %}{% endif %}"
                "{% endfor %}")
    conversation = [{"role": "user", "content": "hello"}]
    rendered = {fmt: text_llm.chat_prompt(conversation, template, content_format=fmt)
                for fmt in ("openai", "string", "auto")}
    assert rendered == {"openai": "P:hello|", "string": "S:hello", "auto": "P:hello|"}
    out = text_llm.chat(conversation, SamplingParams(max_tokens=1), use_tqdm=False,
                        chat_template=template, chat_template_content_format="string")
    assert out[0].prompt == "S:hello"
    with pytest.raises(ValueError, match="chat_template_content_format"):
        text_llm.chat(conversation, SamplingParams(max_tokens=1), use_tqdm=False,
                      chat_template=template, chat_template_content_format="json")


def test_an_llm_after_shutdown_says_so(tiny_model_factory):
    path, _ = tiny_model_factory("llama")
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", max_model_len=64)
    llm.shutdown()
    llm.shutdown()  # twice is harmless
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate([[1, 2, 3]], use_tqdm=False)


@pytest.mark.parametrize("dtype", ["half", "float", torch.float32])
def test_vllm_dtype_spellings(dtype):
    from loom.config import ModelConfig
    expected = {"half": "float16", "float": "float32"}.get(dtype, "float32")
    assert ModelConfig(model="x", dtype=dtype).dtype == expected


def test_an_empty_model_name_is_an_error_not_the_demo_model():
    from loom.engine.arg_utils import EngineArgs
    with pytest.raises(ValueError, match="model"):
        EngineArgs(model="").create_engine_config()


@pytest.mark.parametrize("kwargs, field", [({"max_num_seqs": 10**9}, "max_num_seqs"),
                                           ({"kv_cache_memory_bytes": 10**15}, "kv_cache")])
def test_sizes_beyond_memory_are_value_errors(tiny_model_factory, kwargs, field):
    # These were numpy's ArrayMemoryError and torch's allocator RuntimeError.
    path, _ = tiny_model_factory("llama")
    with pytest.raises(ValueError, match=field):
        LLM(path, skip_tokenizer_init=True, device="cpu", max_model_len=128, **kwargs)


def test_vllm_prompt_dicts(text_llm):
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    ids = text_llm.tokenizer.encode(PROMPTS[0])
    plain = text_llm.generate(PROMPTS[0], params, use_tqdm=False)[0].outputs[0].token_ids
    for prompt in ({"prompt": PROMPTS[0]}, {"prompt_token_ids": ids}):
        assert text_llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids == plain
    both = text_llm.generate([{"prompt": PROMPTS[0]}, {"prompt_token_ids": ids}], params,
                             use_tqdm=False)
    assert [o.outputs[0].token_ids for o in both] == [plain, plain]
    with pytest.raises(ValueError, match="prompt"):
        text_llm.generate({"text": "x"}, params, use_tqdm=False)
    with pytest.raises(ValueError, match="prompts"):
        text_llm.generate(None, params, use_tqdm=False)


@pytest.mark.parametrize("kwargs, field", [
    ({"tensor_parallel_size": "2"}, "tensor_parallel_size"), ({"block_size": "16"}, "block_size"),
    ({"max_model_len": 64.5}, "max_model_len"), ({"max_num_seqs": 1.5}, "max_num_seqs"),
    ({"gpu_memory_utilization": "0.5"}, "gpu_memory_utilization")])
def test_engine_args_types_name_the_field(kwargs, field):
    from loom.engine.arg_utils import EngineArgs
    with pytest.raises(ValueError, match=field):
        EngineArgs(model="llama-3.1-8b", load_format="dummy", **kwargs).create_engine_config()


def test_seed_none_draws_one():
    from loom.engine.arg_utils import EngineArgs
    config = EngineArgs(model="llama-3.1-8b", load_format="dummy", seed=None).create_engine_config()
    assert isinstance(config.model.seed, int)


def test_a_config_narrower_than_its_checkpoint_is_refused(tiny_model_factory, tmp_path):
    # The loaders sliced the checkpoint to the config's width: half an MLP loaded silently.
    import json
    import shutil
    path, _ = tiny_model_factory("llama")
    narrow = tmp_path / "narrow"
    shutil.copytree(path, narrow)
    config = json.loads((narrow / "config.json").read_text())
    config["intermediate_size"] //= 2
    (narrow / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="checkpoint's tensor is .* config makes it"):
        LLM(str(narrow), skip_tokenizer_init=True, device="cpu", max_model_len=64)


# vLLM's EngineArgs batch defaults (its arg_utils: GPUs of >= 70 GiB other than A100 get the
# larger tier), by (device name, memory, usage) -> (max_num_batched_tokens, max_num_seqs).
@pytest.mark.parametrize("name, memory, usage, expected", [
    (None, 0, "llm", (8192, 256)), (None, 0, "api_server", (8192, 256)),
    ("NVIDIA H200", 140 * 2**30, "llm", (16384, 1024)),
    ("NVIDIA H200", 140 * 2**30, "api_server", (8192, 1024)),
    ("NVIDIA A100-SXM4-80GB", 80 * 2**30, "llm", (8192, 256)),
    ("NVIDIA A100-SXM4-80GB", 80 * 2**30, "api_server", (2048, 256)),
    ("NVIDIA L4", 23 * 2**30, "llm", (8192, 256))])
def test_batch_defaults_by_device_as_vllm(name, memory, usage, expected):
    from loom.config import SchedulerConfig
    got = SchedulerConfig(usage_context=usage).resolved(name, memory)
    assert (got.max_num_batched_tokens, got.max_num_seqs) == expected
    given = SchedulerConfig(max_num_seqs=7, max_num_batched_tokens=99,
                            usage_context=usage).resolved(name, memory)
    assert (given.max_num_batched_tokens, given.max_num_seqs) == (99, 7)


def test_engine_and_workers_agree_on_the_batch_limits(text_llm):
    scheduler = text_llm.engine.config.scheduler
    assert (scheduler.max_num_seqs, scheduler.max_num_batched_tokens) == (256, 8192)
    assert text_llm.engine.scheduler.config == scheduler


def test_serve_takes_the_api_server_defaults():
    from loom.engine.arg_utils import EngineArgs
    config = EngineArgs(model="llama-3.1-8b", load_format="dummy").create_engine_config("api_server")
    assert config.scheduler.usage_context == "api_server"
    assert config.scheduler.max_num_seqs is None  # filled in by the worker, per device
    with pytest.raises(ValueError, match="usage_context"):
        EngineArgs(model="llama-3.1-8b", load_format="dummy").create_engine_config("web")
