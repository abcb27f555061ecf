"""The start-up warm-up takes every attention path of the Triton backend and writes no KV."""

import logging
import re
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from loom.attention import triton_backend  # noqa: E402
from loom.attention.triton_backend import TritonBackend  # noqa: E402
from loom.config import EngineConfig, ModelConfig  # noqa: E402
from loom.worker import model_runner as model_runner_module  # noqa: E402
from loom.worker import sampler as sampler_module  # noqa: E402
from loom.worker import warmup as warmup_module  # noqa: E402
from loom.worker.model_runner import ModelRunner  # noqa: E402
from tests.triton_interpreter import patch_interpreter  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="runs the Triton kernels on CPU tensors, interpreted")
if not torch.cuda.is_available():
    patch_interpreter()


def _spy(monkeypatch, module, name, calls, record=None):
    """Count calls of module.name in calls[name]; record(args, kwargs) sees each one."""
    real = getattr(module, name)

    def spy(*args, **kwargs):
        calls[name] += 1
        if record is not None:
            record(args, kwargs)
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, spy)


def test_warm_up_takes_every_attention_path_and_leaves_the_cache(tiny_model_factory,
                                                                  monkeypatch, caplog):
    path, _ = tiny_model_factory("llama")
    caplog.set_level(logging.INFO, logger="loom.worker.warmup")
    config = EngineConfig(ModelConfig(model=path, dtype="float32"))
    runner = ModelRunner(config, torch.device("cpu"))
    runner.backend = TritonBackend()
    split_from = runner.backend.mixed_split_min_decodes
    calls = Counter()
    indexed = Counter()  # launches over a list of request indices (a split step's)

    def index(args, kwargs):
        indexed[kwargs.get("req_index") is not None] += 1
    _spy(monkeypatch, triton_backend, "paged_prefill", calls, index)
    for name in ("write_kv_cache", "rope_write_kv_cache"):
        _spy(monkeypatch, triton_backend, name, calls)
    splits, fused = set(), Counter()  # paged_decode(query, kv_cache, out, ..., num_splits)
    compiled = []  # compile-only calls: (block_n, warps, stages, splits, rotary fused)

    def record(args, kwargs):
        if kwargs.get("compile_only"):
            compiled.append((kwargs["block_n"], kwargs["num_warps"], kwargs["num_stages"],
                             args[8], kwargs.get("new_tokens") is not None))
            return
        splits.add(args[8])
        fused[kwargs.get("new_tokens") is not None] += 1
    _spy(monkeypatch, triton_backend, "paged_decode", calls, record)
    _spy(monkeypatch, TritonBackend, "_sdpa_prefill", calls)
    _spy(monkeypatch, sampler_module, "apply_top_k_top_p", calls)
    _spy(monkeypatch, model_runner_module, "warm_up", calls)
    from loom.kernels import paged_decode as paged_decode_module
    mixed = set()  # the mixed-step variants, run directly: (block_n, warps, stages, splits)
    real_decode = paged_decode_module.paged_decode

    def direct_decode(*a, **kw):
        mixed.add((kw["block_n"], kw["num_warps"], kw["num_stages"], a[8]))
        return real_decode(*a, **kw)
    monkeypatch.setattr(paged_decode_module, "paged_decode", direct_decode)
    sampled = []
    real_sample = sampler_module.Sampler.forward

    def sample(self, logits, metadata):
        sampled.append((metadata.all_greedy, metadata.all_random, metadata.no_top_p))
        return real_sample(self, logits, metadata)
    monkeypatch.setattr(sampler_module.Sampler, "forward", sample)

    logits_rows = []
    real_logits = runner.model.compute_logits

    def compute_logits(hidden):
        logits_rows.append(hidden.shape[0])
        return real_logits(hidden)
    monkeypatch.setattr(runner.model, "compute_logits", compute_logits)

    inference = []  # each step's mode: Dynamo guards on it, and a normal tensor re-traced
    real_run_step = warmup_module.run_step  # the whole forward (5.6 s more on an H200)

    def run_step(*a, **kw):
        inference.append(torch.is_inference_mode_enabled())
        return real_run_step(*a, **kw)
    monkeypatch.setattr(warmup_module, "run_step", run_step)

    runner.initialize_cache(8)  # compiles (level 0 here) and warms up
    assert calls["warm_up"] == 1
    assert len(inference) == len(warmup_module.STEP_SHAPES) + 1 and all(inference)
    # the LM head at every row count the decode GEMV takes (then the sampler's two rows)
    from loom.kernels.gemv import MAX_M
    assert warmup_module.LOGITS_ROWS == MAX_M
    assert logits_rows[-MAX_M - 1:] == [*range(1, MAX_M + 1), 2]
    num_layers = len(runner.kv_caches)
    # STEP_SHAPES: one fresh prompt goes to the paged prefill kernel and once more, its
    # threshold lifted, to SDPA; five prompts, a chunk after context and a prompt beside
    # one decode (too few decodes to split) go to the paged prefill kernel; two decode
    # batches to the split-K decode kernel, one with a single split (no merge) and one with
    # several. Then a prompt beside enough decodes is split, its prompt to the
    # prefill kernel and its decodes to the decode kernel (both with a request index: that
    # warms those variants up too). Every layer does each, and writes (to nowhere) every
    # time, with rotary applied on the way (the runner leaves it to this backend): in the
    # rope + KV write kernel, or, in the two pure decode steps, inside the decode kernel.
    assert split_from > 1 and warmup_module.split_shape(runner)[0][1].count(1) == split_from
    assert calls["_sdpa_prefill"] == num_layers
    assert calls["paged_prefill"] == 5 * num_layers
    assert indexed == {False: 4 * num_layers, True: num_layers}
    assert runner.backend.sdpa_min_tokens == 2048  # lifted for that shape alone
    assert calls["paged_decode"] == 3 * num_layers + len(compiled)
    assert 1 in splits and max(splits) > 1, splits
    assert fused == {True: 2 * num_layers, False: num_layers}
    assert calls["rope_write_kv_cache"] == (len(warmup_module.STEP_SHAPES) + 1 - 2) * num_layers
    assert calls["write_kv_cache"] == 0
    assert calls["apply_top_k_top_p"] == 1
    # each sampler path once: all greedy, all random, the two mixed, top-p
    assert sampled == [(True, False, True), (False, True, True), (False, False, True),
                       (False, False, False)]
    # every decode variant a mixed step can reach, each split count's SPLITS_PAD with them
    cache = runner.kv_caches[0]
    want = warmup_module.decode_variants(
        runner.backend, cache.shape[3], cache.shape[4], runner.dtype,
        range(1, runner.config.scheduler.max_num_seqs + 1), runner.requests.tokens.shape[1],
        cache.dtype, mixed=True)
    assert mixed == set(want) and {s for _, _, _, s in want} >= {1, 2}
    # ...and every variant a pure decode outside CUDA graphs can reach (all of them here:
    # none on the CPU), compiled once each at the first layer of one such step, with the
    # rotary fused as the model's decodes call it
    eager = warmup_module.decode_variants(
        runner.backend, cache.shape[3], cache.shape[4], runner.dtype,
        range(1, runner.config.scheduler.max_num_seqs + 1), runner.requests.tokens.shape[1],
        cache.dtype)
    assert runner.decode_graph_sizes() == [] and len({s for _, _, _, s in eager}) >= 3
    assert sorted(compiled) == sorted((*v, True) for v in eager)
    # the log line says where the seconds went
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("warm-up:"))
    assert f"{len(eager)} decode kernel variants of decodes outside CUDA graphs" in line, line
    assert re.search(r"and the sampler in [\d.]+ s \(step shapes [\d.]+, mixed decodes "
                     r"[\d.]+, SDPA [\d.]+, LM head [\d.]+, sampler [\d.]+ s\)$", line), line

    for cache in runner.kv_caches:
        cache.normal_()
    before = [cache.clone() for cache in runner.kv_caches]
    warmup_module.warm_up(runner)
    for cache, old in zip(runner.kv_caches, before):
        assert torch.equal(cache, old)


def test_warm_up_skips_shapes_longer_than_the_model(tiny_model_factory):
    path, _ = tiny_model_factory("llama")
    config = EngineConfig(ModelConfig(model=path, dtype="float32", max_model_len=40))
    runner = ModelRunner(config, torch.device("cpu"))
    runner.backend = TritonBackend()
    runner.initialize_cache(8)  # would fail on the 48-token shape if it ran
    assert max(max(s[2]) for s in warmup_module.STEP_SHAPES) > 40


def test_step_positions_end_each_request_at_its_length():
    positions = warmup_module.step_positions([1, 3], [5, 3], 6)
    assert positions.tolist() == [4, 0, 1, 2, 0, 0]


@pytest.mark.parametrize("fewest", ["1", None, "pure"])
def test_decode_variants_cover_every_reachable_kernel(fewest, monkeypatch):
    """Brute force over every batch size and context length (not the powers of two the
    enumeration samples): each compiled variant of the decode kernel (block_n, stages,
    SPLITS_PAD) a decode batch can meet is among those warmed up, at Llama-3.1-8B's and
    Qwen3's bf16 heads: a mixed step's with every decode count split (fewest 1) and from
    the default count up; or (pure) a pure decode's, from a batch size on (those above the
    largest CUDA graph)."""
    mixed = fewest != "pure"
    if fewest == "1":
        monkeypatch.setenv("LOOM_MIXED_SPLIT_MIN_DECODES", fewest)
    backend = TritonBackend()
    for kv_heads, max_seqs, max_len, cache in ((8, 256, 1100, None), (4, 300, 700, None),
                                               (8, 256, 1100, torch.float8_e4m3fn)):
        batches = range(1 if mixed else 41, max_seqs + 1)
        got = warmup_module.decode_variants(backend, kv_heads, 128, torch.bfloat16, batches,
                                            max_len, cache, mixed=mixed)
        warmed = {(bn, w, st, 1 if s == 1 else 1 << (s - 1).bit_length())
                  for bn, w, st, s in got}
        reachable = set()
        for n in batches:
            tiles = backend.decode_tiles(n, kv_heads, 128, torch.bfloat16, cache)
            bn, w, st = tiles
            for seq_len in range(1, max_len + 1):
                if (mixed and n < backend.mixed_split_min_decodes
                        and seq_len < backend.mixed_split_min_context):
                    continue  # one launch: no decode kernel
                s = backend.decode_splits(n, kv_heads, seq_len, tiles, cache or torch.bfloat16)
                reachable.add((bn, w, st, 1 if s == 1 else 1 << (s - 1).bit_length()))
        assert warmed == reachable
        if fewest == "1":  # over an 8-bit cache, both tiles at these batches
            assert {bn for bn, _, _, _ in reachable} == ({128} if cache is None else {64, 128})
            assert {w for _, w, _, _ in reachable} == ({4} if cache is None else {2, 4})
        assert len(got) == len(warmed)  # one launch per variant


def test_the_split_shape_needs_a_split_and_room_for_it(monkeypatch):
    """A split mixed step is warmed up only where the backend splits some step that "a
    prompt beside a decode" does not: by its count of decodes where the batch holds them,
    else by one decode's context where the model's length reaches the threshold."""
    import numpy as np

    def runner(max_num_seqs, max_len, backend):
        tokens = np.zeros((max_num_seqs, max_len))
        return SimpleNamespace(backend=backend, requests=SimpleNamespace(tokens=tokens))
    monkeypatch.setenv("LOOM_MIXED_SPLIT_MIN_DECODES", "5")
    monkeypatch.setenv("LOOM_MIXED_SPLIT_MIN_CONTEXT", "100")
    (name, query_lens, seq_lens), = warmup_module.split_shape(runner(6, 64, TritonBackend()))
    assert query_lens == [1] * 5 + [37] and len(seq_lens) == 6 and "5 decodes" in name
    assert warmup_module.split_shape(runner(5, 64, TritonBackend())) == []  # room for neither
    (name, query_lens, seq_lens), = warmup_module.split_shape(runner(5, 100, TritonBackend()))
    assert (query_lens, seq_lens) == ([1, 37], [100, 37]) and "100-token decode" in name
    assert warmup_module.split_shape(runner(6, 64, object())) == []  # a backend never splitting
    monkeypatch.setenv("LOOM_MIXED_SPLIT_MIN_CONTEXT", "40")  # "a prompt beside a decode" splits
    assert warmup_module.split_shape(runner(6, 64, TritonBackend())) == []
    monkeypatch.setenv("LOOM_MIXED_SPLIT_MIN_CONTEXT", "100")
    monkeypatch.setenv("LOOM_MIXED_SPLIT_MIN_DECODES", "1")  # so it does here
    assert warmup_module.split_shape(runner(6, 64, TritonBackend())) == []


def test_eager_decode_variants_are_those_of_batches_above_the_graphs(monkeypatch):
    """Pure decodes run outside CUDA graphs from the largest graph's size up (every size
    where there are none); a batch the graphs hold needs no variant of its own."""
    import numpy as np
    monkeypatch.setenv("LOOM_DECODE_SPLITS", "1")  # one variant per tile: batches tell apart
    cache = torch.zeros(2, 1, 16, 8, 128, dtype=torch.float8_e4m3fn)

    def runner(graph_sizes, max_num_seqs):
        return SimpleNamespace(
            backend=TritonBackend(), kv_caches=[cache], dtype=torch.bfloat16,
            decode_graph_sizes=lambda: graph_sizes, requests=SimpleNamespace(
                tokens=np.zeros((max_num_seqs, 512))),
            config=SimpleNamespace(scheduler=SimpleNamespace(max_num_seqs=max_num_seqs)))
    # 8 KV heads over an 8-bit cache: 2-warp tiles from 8 requests (64 programs) on
    wide, narrow = (64, 2, 3, 1), (128, 4, 2, 1)
    assert warmup_module.eager_decode_variants(runner([], 16)) == [wide, narrow]
    assert warmup_module.eager_decode_variants(runner([1, 2, 4], 16)) == [wide, narrow]
    assert warmup_module.eager_decode_variants(runner([1, 2, 4, 8], 16)) == [wide]
    assert warmup_module.eager_decode_variants(runner([1, 2, 4, 8, 16], 16)) == []
