"""vLLM's engine flags that `vllm serve` command lines carry: --hf-overrides,
--override-generation-config, --tokenizer-mode, -pp/-dp and --distributed-executor-backend,
each honoured where loom can and refused by name where it cannot."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from loom.config import ModelConfig, ParallelConfig
from loom.engine.arg_utils import EngineArgs
from loom.models.arch import ModelArch
from loom.models.loader import generation_defaults, resolve, with_overrides
from tests.conftest import hf_greedy, hf_last_logprobs
from tests.test_cli import _main_error

SHIPPED = dict(model="llama-3.1-8b", load_format="dummy")


def _config(**kwargs):
    return EngineArgs(**SHIPPED, **kwargs).create_engine_config()


def _parsed(*flags: str) -> EngineArgs:
    from loom.cli import build_parser
    return EngineArgs.from_cli_args(build_parser().parse_args(
        ["serve", "--model", "llama-3.1-8b", "--load-format", "dummy", *flags]))


# -- --hf-overrides ---------------------------------------------------------------------------
def test_hf_overrides_reach_every_reader_of_the_config():
    """One place (resolve) applies them: the engine core, workers, LoRA targets and
    benchmarks all read the config through it."""
    flag = _parsed("--hf-overrides", '{"rope_theta": 1000.0, "max_position_embeddings": 2048}')
    config = flag.create_engine_config()
    assert config.model.hf_overrides == {"rope_theta": 1000.0, "max_position_embeddings": 2048}
    arch = ModelArch.from_hf_config(resolve(config.model).hf_config)
    plain = ModelArch.from_hf_config(resolve(_config().model).hf_config)
    assert (arch.rope_theta, arch.max_position_embeddings) == (1000.0, 2048)
    assert (plain.rope_theta, plain.max_position_embeddings) == (500000.0, 131072)
    assert _config(hf_overrides={"rope_theta": 1000.0, "max_position_embeddings": 2048}) == config


def test_hf_overrides_replace_a_value_whole_but_update_a_nested_config():
    """As vLLM (transformers' config.update): rope_scaling given is the whole of it; a
    sub-config (text_config, with its own model_type) is updated key by key."""
    base = {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}, "hidden_size": 64,
            "text_config": {"model_type": "llama", "hidden_size": 64,
                            "rope_scaling": {"rope_type": "yarn", "factor": 2.0}}}
    merged = with_overrides(base, {"rope_scaling": {"rope_type": "yarn", "factor": 4.0},
                                   "text_config": {"rope_scaling": {"factor": 3.0}}})
    assert merged["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0}
    assert merged["text_config"] == {"model_type": "llama", "hidden_size": 64,
                                     "rope_scaling": {"rope_type": "yarn", "factor": 3.0}}
    assert base["rope_scaling"]["factor"] == 8.0  # the reader's dict is untouched
    # A number may become a list (eos_token_id takes both), a null an object.
    assert with_overrides({"eos_token_id": 2, "rope_scaling": None},
                          {"eos_token_id": [2, 7], "rope_scaling": {"factor": 2.0}}) == \
        {"eos_token_id": [2, 7], "rope_scaling": {"factor": 2.0}}


@pytest.mark.parametrize("value, message", [
    ("{not json", "hf_overrides: not valid JSON"),
    ("[1, 2]", "hf_overrides: expected a JSON object (a dict), got list"),
    (lambda config: config, "hf_overrides: a function is not taken"),
    ({"x": {1, 2}}, "hf_overrides: must hold only JSON values"),
])
def test_hf_overrides_that_cannot_reach_the_engine_are_refused(value, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        _config(hf_overrides=value)


@pytest.mark.parametrize("overrides, message", [
    ({"num_attention_heads": 0}, "hf_overrides.num_attention_heads: must be a positive integer, "
                                 "got 0"),
    ({"hidden_size": None}, "hf_overrides.hidden_size: must be a positive integer, got None"),
    ({"max_position_embeddings": -1}, "hf_overrides.max_position_embeddings: must be a "
                                      "positive integer, got -1"),
    ({"rms_norm_eps": "x"}, "hf_overrides.rms_norm_eps: must be a number (as config.json's), "
                            "got 'x'"),
    ({"architectures": "LlamaForCausalLM"}, "hf_overrides.architectures: must be a list"),
    ({"rope_scaling": "x"}, "hf_overrides.rope_scaling: must be an object"),
])
def test_hf_overrides_of_the_wrong_kind_name_the_key(overrides, message):
    """Each failed deep in the model's arithmetic (a ZeroDivisionError, a TypeError)."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        resolve(_config(hf_overrides=overrides).model)


@pytest.mark.parametrize("overrides", [{"vocab_size": 10}, {"vocab_size": 300}])
def test_an_embedding_the_overrides_resize_is_refused(tiny_model_factory, overrides):
    """vLLM's loader checks the checkpoint's embedding against the config; loom sliced or
    zero-padded it (a vocabulary of 10 then generated only ids 0..9)."""
    from loom import LLM
    path, _ = tiny_model_factory("llama")
    with pytest.raises(ValueError, match=r"^(VocabParallelEmbedding|ParallelLMHead): the "
                                         r"checkpoint's tensor is \[256, 64\]"):
        LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=64,
            hf_overrides=overrides)


def test_hf_overrides_compute_what_transformers_computes_with_them(tiny_model_factory):
    """A new rope base and context length, offline: loom's tokens and logprobs are those of
    a transformers model built from the same overridden config, and not the file's. The
    model runs in a worker process (--distributed-executor-backend mp, at TP 1 as in vLLM),
    which reads the overrides too; --override-generation-config's defaults (greedy, 6
    tokens) apply to a bare generate."""
    import transformers as tf

    from loom import LLM, SamplingParams
    path, plain = tiny_model_factory("llama")
    overrides = {"rope_parameters": {"rope_type": "default", "rope_theta": 40.0},
                 "max_position_embeddings": 96}
    config = json.loads((Path(path) / "config.json").read_text()) | overrides
    hf = tf.LlamaForCausalLM.from_pretrained(path, config=tf.LlamaConfig.from_dict(config)).eval()
    prompt = [(7 * i) % 250 + 3 for i in range(48)]
    llm = LLM(path, hf_overrides=overrides, skip_tokenizer_init=True, device="cpu",
              dtype="float32", enforce_eager=True, distributed_executor_backend="mp",
              override_generation_config={"temperature": 0.0, "max_new_tokens": 6})
    try:
        assert type(llm.engine.executor).__name__ == "MultiprocExecutor"
        assert llm.engine.max_model_len == 96
        out = llm.generate([prompt], use_tqdm=False)[0].outputs[0]
        first = llm.generate([prompt], SamplingParams(max_tokens=1, logprobs=0),
                             use_tqdm=False)[0].outputs[0]
    finally:
        llm.shutdown()
    assert out.token_ids == hf_greedy(hf, prompt, 6)
    token = first.token_ids[0]
    ours = first.logprobs[0][token].logprob
    assert ours == pytest.approx(hf_last_logprobs(hf, prompt)[token].item(), abs=1e-4)
    assert abs(ours - hf_last_logprobs(plain, prompt)[token].item()) > 1e-3


# -- --override-generation-config -------------------------------------------------------------
def test_override_generation_config_merges_over_the_file(tmp_path):
    """vLLM's: over the file's keys under auto, alone under vllm; null unsets a key."""
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.9, "max_new_tokens": 50}))
    model = str(tmp_path)
    overrides = {"temperature": 0.5, "top_p": None, "top_k": 4}
    assert generation_defaults(model, "auto", overrides) == {
        "temperature": 0.5, "top_k": 4, "max_tokens": 50}
    assert generation_defaults(model, "vllm", overrides) == {"temperature": 0.5, "top_k": 4}
    config = _parsed("--override-generation-config", '{"temperature": 0.5}')
    assert config.create_engine_config().model.override_generation_config == {"temperature": 0.5}


@pytest.mark.parametrize("flag, message", [
    ('{"max_tokens": 5}', "override_generation_config: unknown key(s) ['max_tokens'] "
                          "(generation_config.json calls max_tokens max_new_tokens); it takes"),
    ('{"temperature": "hot"}', "override_generation_config: temperature: must be a number"),
    ('{"top_p": 7}', "override_generation_config: top_p: must be in (0, 1], got 7"),
    ('"warm"', "override_generation_config: expected a JSON object (a dict), got str"),
])
def test_a_bad_override_generation_config_fails_at_start_up(capsys, monkeypatch, flag, message):
    from loom.entrypoints.openai import launcher
    monkeypatch.setattr(launcher, "run_server", _no_server)
    err = _main_error(capsys, "serve", "llama-3.1-8b", "--load-format", "dummy", "--device",
                      "cpu", "--override-generation-config", flag)
    assert err.startswith(f"loom serve: error: {message}") and err.count("\n") == 1, err


def _no_server(*args, **kwargs):
    raise AssertionError("the server started despite a bad flag")


# -- --tokenizer-mode, -pp, -dp, --distributed-executor-backend -------------------------------
def test_tokenizer_mode_auto_and_hf_are_the_same_tokenizer():
    assert _parsed().create_engine_config() == _parsed("--tokenizer-mode", "auto") \
        .create_engine_config()
    assert _parsed("--tokenizer-mode", "hf").create_engine_config().model.tokenizer_mode == "hf"


@pytest.mark.parametrize("mode", ["slow", "mistral", "custom"])
def test_other_tokenizer_modes_are_refused(mode):
    with pytest.raises(ValueError, match=f"^tokenizer_mode: '{mode}' is not supported; loom "
                                         "reads tokenizer.json with the `tokenizers` library"):
        _config(tokenizer_mode=mode)


def test_one_pipeline_or_data_parallel_rank_is_accepted():
    config = _parsed("-pp", "1", "--data-parallel-size", "1", "--distributed-executor-backend",
                     "mp").create_engine_config()
    assert config.parallel == ParallelConfig(1, 1, 1, "mp")
    assert config.parallel.worker_processes  # as vLLM: mp is a worker process, TP 1 too
    assert not _config().parallel.worker_processes
    assert _config(tensor_parallel_size=2).parallel.worker_processes


@pytest.mark.parametrize("flags, message", [
    (["-pp", "2"], "pipeline_parallel_size: loom has no pipeline parallelism (only 1 is "
                   "accepted, got 2); shard the model with -tp"),
    (["-dp", "4"], "data_parallel_size: LLM runs one engine core in this process (got 4); "
                   "`loom serve -dp N` runs N replicas, or run one LLM per device"),
    (["-dp", "0"], "data_parallel_size: must be positive, got 0"),
    (["--distributed-executor-backend", "ray"], "distributed_executor_backend: 'ray' is not "
     "supported: loom has no Ray executor"),
    (["--distributed-executor-backend", "external_launcher"], "it does not run under torchrun"),
    (["--distributed-executor-backend", "uni", "-tp", "2"], "distributed_executor_backend: uni "
     "runs one worker in the engine core's process; tensor_parallel_size 2 needs mp"),
])
def test_parallelism_loom_has_not_is_refused_by_name(capsys, flags, message):
    err = _main_error(capsys, "generate", "--model", "llama-3.1-8b", "--load-format", "dummy",
                      "--prompt", "x", *flags)
    assert message in err and err.count("\n") == 1, err


def test_model_config_checks_its_new_fields():
    with pytest.raises(ValueError, match="^tokenizer_mode: "):
        ModelConfig("m", tokenizer_mode="slow")
    assert ModelConfig("m", hf_overrides='{"a": 1}').hf_overrides == {"a": 1}


# -- --num-gpu-blocks-override ----------------------------------------------------------------
def test_num_gpu_blocks_override_reaches_the_cache_config():
    """(The KV cache it sizes, preempting when full, is tested in test_correctness.)"""
    assert _parsed("--num-gpu-blocks-override", "20").create_engine_config(
        ).cache.num_gpu_blocks_override == 20
    assert _config().cache.num_gpu_blocks_override is None
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="num_gpu_blocks_override: must be a positive"):
            _config(num_gpu_blocks_override=bad)


def test_too_few_override_blocks_name_the_flag(tiny_model_factory):
    from loom import LLM
    path, _ = tiny_model_factory("llama")
    with pytest.raises(ValueError, match="raise --num-gpu-blocks-override or lower "
                                         "--max-model-len"):
        LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=160,
            num_gpu_blocks_override=2)


# -- human-readable integers ------------------------------------------------------------------
@pytest.mark.parametrize("flag, text, value", [
    ("--max-model-len", "32k", 32000), ("--max-model-len", "32K", 32768),
    ("--max-model-len", "25.6k", 25600), ("--max-model-len", " 4096 ", 4096),
    ("--max-num-batched-tokens", "8K", 8192), ("--kv-cache-memory-bytes", "1G", 2**30),
    ("--kv-cache-memory-bytes", "1.5g", 1_500_000_000), ("--kv-cache-memory-bytes", "1T", 2**40)])
def test_size_flags_take_vllms_human_readable_integers(flag, text, value):
    assert getattr(_parsed(flag, text), flag[2:].replace("-", "_")) == value


@pytest.mark.parametrize("text, reason", [("1.5K", "a fraction takes a decimal suffix"),
                                          ("32kb", "invalid integer"), ("1e3", "invalid integer"),
                                          ("", "invalid integer")])
def test_bad_human_readable_integers_are_one_cli_error(text, reason, capsys):
    with pytest.raises(SystemExit):
        _parsed("--max-model-len", text)
    err = capsys.readouterr().err
    assert "argument --max-model-len: " in err and reason in err and "Traceback" not in err


def test_a_negative_length_still_names_the_field():
    with pytest.raises(ValueError, match="^max_model_len: must be positive, got -1000"):
        _parsed("--max-model-len=-1k").create_engine_config()


# -- --disable-custom-all-reduce --------------------------------------------------------------
def test_disable_custom_all_reduce_reaches_the_parallel_config():
    assert _parsed("--disable-custom-all-reduce").create_engine_config(
        ).parallel.disable_custom_all_reduce is True
    assert _config().parallel.disable_custom_all_reduce is False
    with pytest.raises(ValueError, match="^disable_custom_all_reduce: must be True or False"):
        _config(disable_custom_all_reduce="no")


def test_disabled_small_all_reduces_never_touch_the_group(monkeypatch):
    """Disabled, no symmetric buffer is set up (the group is not even looked up), so every
    all-reduce falls to NCCL; enabled, the same call goes on to look the group up."""
    import torch

    from loom.distributed import ops
    looked_up = []

    def lookup(name):
        looked_up.append(name)
        raise RuntimeError("stop here")
    monkeypatch.setattr(ops, "get_group", lookup)
    assert ops.init_small_all_reduce("tp", torch.bfloat16, torch.device("cuda"),
                                     disabled=True) is False
    assert looked_up == []
    with pytest.raises(RuntimeError, match="stop here"):
        ops.init_small_all_reduce("tp", torch.bfloat16, torch.device("cuda"))
    assert looked_up == ["tp"]


# -- --cudagraph-capture-sizes, --max-cudagraph-capture-size, --max-seq-len-to-capture ---------
def test_capture_flags_set_the_compilation_config():
    compilation = _parsed("--cudagraph-capture-sizes", "1", "2", "4", "16",
                          "-O", '{"level": 3}').create_engine_config().compilation
    assert compilation.cudagraph_capture_sizes == (1, 2, 4, 16) and compilation.level == 3
    assert compilation.capture_sizes(256) == [1, 2, 4, 16]
    compilation = _parsed("--max-cudagraph-capture-size", "24").create_engine_config(
        ).compilation
    assert compilation.max_cudagraph_capture_size == 24
    assert compilation.capture_sizes(256) == [1, 2, 4, 8, 16, 24]
    assert _config(cudagraph_capture_sizes=[8, 2]).compilation.cudagraph_capture_sizes == (8, 2)


def test_capture_flags_given_twice_or_bad_are_refused():
    with pytest.raises(ValueError, match="^cudagraph_capture_sizes: given both"):
        _parsed("--cudagraph-capture-sizes", "8", "-O",
                '{"cudagraph_capture_sizes": [4]}').create_engine_config()
    with pytest.raises(ValueError, match="^max_cudagraph_capture_size: given both"):
        _parsed("--max-cudagraph-capture-size", "8", "-O.max_cudagraph_capture_size=8"
                ).create_engine_config()
    with pytest.raises(ValueError, match="max_cudagraph_capture_size: 8 is not the largest"):
        _parsed("--cudagraph-capture-sizes", "4", "16", "--max-cudagraph-capture-size", "8"
                ).create_engine_config()
    with pytest.raises(ValueError, match="cudagraph_capture_sizes"):
        _config(cudagraph_capture_sizes=[0])
    with pytest.raises(ValueError, match="^max_seq_len_to_capture: must be an integer"):
        _config(max_seq_len_to_capture="8k")


def test_max_seq_len_to_capture_is_accepted_with_one_line(caplog):
    with caplog.at_level(logging.INFO, logger="loom.engine.arg_utils"):
        config = _parsed("--max-seq-len-to-capture", "8192").create_engine_config()
    assert config.compilation == _config().compilation
    assert "max_seq_len_to_capture: unused" in caplog.text


# -- --guided-decoding-backend, --structured-outputs-config -----------------------------------
@pytest.mark.parametrize("flags, says", [
    (["--guided-decoding-backend", "auto"], False),
    (["--guided-decoding-backend", "guidance"], False),
    (["--guided-decoding-backend", "xgrammar:disable-any-whitespace"], True),
    (["--structured-outputs-config", '{"backend": "outlines", "disable_fallback": true}'], True),
    (["--structured-outputs-config", '{"disable_any_whitespace": false}'], False)])
def test_structured_output_backends_are_accepted(flags, says, caplog):
    with caplog.at_level(logging.INFO, logger="loom.engine.arg_utils"):
        _parsed(*flags).create_engine_config()
    assert ("loom runs every constraint on llguidance" in caplog.text) is says


@pytest.mark.parametrize("flags, message", [
    (["--guided-decoding-backend", "lmfe"], "^guided_decoding_backend: 'lmfe' is not one of"),
    (["--structured-outputs-config", '{"backend": "x"}'],
     "^structured_outputs_config.backend: 'x' is not one of"),
    (["--guided-decoding-backend", "xgrammar:fast"], r"^guided_decoding_backend: unknown option"),
    (["--structured-outputs-config", '{"reasoning_parser": "x"}'],
     r"^structured_outputs_config: \['reasoning_parser'\] not supported"),
    (["--structured-outputs-config", '{"disable_fallback": "yes"}'],
     "^structured_outputs_config.disable_fallback: must be true or false"),
    (["--structured-outputs-config", "[1]"], "^structured_outputs_config: expected a JSON object")])
def test_bad_structured_output_configs_name_the_field(flags, message):
    with pytest.raises(ValueError, match=message):
        _parsed(*flags).create_engine_config()


def test_vllm_010s_cuda_graph_sizes():
    one = _parsed("--cuda-graph-sizes", "24").create_engine_config().compilation
    assert one.max_cudagraph_capture_size == 24 and one.cudagraph_capture_sizes is None
    several = _parsed("--cuda-graph-sizes", "1", "8", "32").create_engine_config().compilation
    assert several.cudagraph_capture_sizes == (1, 8, 32)
    with pytest.raises(ValueError, match="^cuda_graph_sizes: cudagraph_capture_sizes is given"):
        _parsed("--cuda-graph-sizes", "1", "8", "--cudagraph-capture-sizes", "4"
                ).create_engine_config()
    with pytest.raises(ValueError, match="^max_cudagraph_capture_size: given both"):
        _parsed("--cuda-graph-sizes", "16", "-O", '{"max_cudagraph_capture_size": 16}'
                ).create_engine_config()


def test_flags_whose_request_loom_already_meets_are_accepted():
    plain = _config()
    for flags in (["--disable-cascade-attn"], ["--no-use-tqdm-on-load"],
                  ["--max-parallel-loading-workers", "4"]):
        assert _parsed(*flags).create_engine_config() == plain


def test_the_python_api_takes_them_too():
    plain = _config()
    assert _config(disable_cascade_attn=True, use_tqdm_on_load=False,
                   max_parallel_loading_workers=2) == plain
    with pytest.raises(ValueError, match="^disable_cascade_attn: must be True or False"):
        _config(disable_cascade_attn="no")
    with pytest.raises(ValueError, match="^max_parallel_loading_workers: must be an integer"):
        _config(max_parallel_loading_workers="2")


def test_prefix_caching_hash_algo_is_vllms():
    assert _config().cache.prefix_caching_hash_algo == "builtin"
    for given, used in (("sha256", "sha256"), ("sha256_cbor", "sha256")):
        assert _config(prefix_caching_hash_algo=given).cache.prefix_caching_hash_algo == used
    with pytest.raises(ValueError, match="prefix_caching_hash_algo: must be builtin or sha256, "
                                         "got 'xxhash'"):
        _config(prefix_caching_hash_algo="xxhash")
