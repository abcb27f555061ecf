"""The GPU path (Triton attention, CUDA graphs, compile levels) against the CPU reference
and transformers. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from loom import LLM, SamplingParams
from tests.e2e.test_correctness import _prompts

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PARAMS = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def _tokens(path: str, **kwargs) -> list[list[int]]:
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=256, **kwargs)
    outs = llm.generate(_prompts(5, (5, 40, 17, 90, 3, 33)), PARAMS, use_tqdm=False)
    llm.shutdown()
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe", "qwen2_moe", "phi3", "phi3_partial",
                                  "mistral_window", "gemma", "gemma2", "gemma3", "olmo2",
                                  "olmo3", "glm4", "seed_oss", "ernie4_5", "exaone4",
                                  "arcee"])
@pytest.mark.parametrize("compilation", [
    dict(enforce_eager=True), dict(compilation_config={"level": 0}), dict(),
    dict(compilation_config={"level": 3}),
    dict(compilation_config={"level": 3, "splitting_ops": [], "compile_sizes": [4]}),
    dict(compilation_config={"level": 3, "cudagraph_mode": "PIECEWISE"}),
    dict(compilation_config={"level": 3, "cudagraph_mode": "FULL"}),
    dict(compilation_config={"level": 0, "cudagraph_mode": "FULL"}),
], ids=["eager", "level0-cuda-graphs", "default", "level3", "level3-whole-graph", "piecewise",
        "full", "level0-full"])
def test_gpu_float32_equals_cpu(kind, compilation, tiny_model_factory, monkeypatch):
    """Prompts of 188 tokens in steps of at most 64: chunks beside decodes, then decodes.
    Under FULL every step replays a whole-forward graph (the mixed ones at 8-64 tokens)."""
    from loom.worker.cuda_graph import CUDAGraphRunner
    path, _ = tiny_model_factory(kind)
    cpu = _tokens(path, device="cpu", dtype="float32")
    mixed = []
    run_mixed = CUDAGraphRunner.run_mixed
    monkeypatch.setattr(CUDAGraphRunner, "run_mixed", lambda self, batch, size: (
        mixed.append(size), run_mixed(self, batch, size))[1])
    gpu = _tokens(path, device="cuda", dtype="float32", max_num_batched_tokens=64, **compilation)
    assert gpu == cpu
    full = compilation.get("compilation_config", {}).get("cudagraph_mode") == "FULL"
    assert (len(mixed) >= 3) == full and set(mixed) <= {8, 16, 32, 64}


@pytest.mark.parametrize("kind, graphs", [
    ("llama", {}), ("qwen3", {}),
    ("llama", {"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [1, 32]})])
def test_gpu_lone_request_equals_cpu(kind, graphs, tiny_model_factory):
    """One request at a time: every decode step is one token, replayed from the batch-1
    CUDA graph that the general (many-token) compiled graph was captured into; under
    PIECEWISE, from the pieces captured at one token, the prompt's at 32."""
    path, _ = tiny_model_factory(kind)
    prompt = _prompts(7, (21,))
    out = []
    for device, extra in (("cpu", {}),
                          ("cuda", {"compilation_config": {"level": 3, **graphs}})):
        llm = LLM(path, skip_tokenizer_init=True, max_model_len=256, device=device,
                  dtype="float32", **extra)
        out.append(llm.generate(prompt, PARAMS, use_tqdm=False)[0].outputs[0].token_ids)
        llm.shutdown()
    assert out[1] == out[0]


def test_gpu_bf16_first_tokens_match_transformers(tiny_model_factory):
    path, hf = tiny_model_factory("llama")
    hf = hf.to("cuda", torch.bfloat16)
    llm = LLM(path, skip_tokenizer_init=True, dtype="bfloat16", device="cuda", max_model_len=256)
    prompts = _prompts(6, (12, 30, 7))
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                        use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=4,
                              do_sample=False, pad_token_id=0, eos_token_id=None)
        assert out.outputs[0].token_ids[:2] == ref[0, len(prompt):len(prompt) + 2].tolist()


def test_gpu_logit_options_equal_cpu(tiny_model_factory):
    """logit_bias, allowed_token_ids and bad words shape the distribution on the device
    (index_put_, masked rows) exactly as on the CPU, batched with a plain greedy row."""
    path, _ = tiny_model_factory("llama")
    prompts = _prompts(9, (12, 30, 7, 25))
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                             logit_bias={5: 1.5, 77: -100.0, 201: 1.0}),
              SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                             allowed_token_ids=[3, 50, 70, 90]),
              SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                             bad_words_token_ids=[[11], [40, 41]]),
              PARAMS]
    out = []
    for device in ("cpu", "cuda"):
        llm = LLM(path, skip_tokenizer_init=True, max_model_len=256, device=device,
                  dtype="float32")
        out.append([o.outputs[0].token_ids
                    for o in llm.generate(prompts, params, use_tqdm=False)])
        llm.shutdown()
    assert out[1] == out[0]
    assert set(out[0][1]) <= {3, 50, 70, 90} and 11 not in out[0][2]


@pytest.mark.parametrize("compilation", [{}, {"cudagraph_mode": "FULL"}], ids=["default", "full"])
def test_gpu_spec_decode_equals_cpu(compilation, tiny_model_factory):
    """n-gram drafts verified on the device (their steps through piece graphs, or FULL's
    mixed graphs) give the CPU's greedy tokens, with drafts accepted."""
    from loom.core.spec_decode import SpecDecoder
    from tests.e2e.test_spec_decode import SPEC
    from tests.e2e.test_spec_decode import _prompts as spec_prompts
    path, _ = tiny_model_factory("llama")
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    out, accepted = [], []
    for device, extra in (("cpu", {}), ("cuda", {"compilation_config": compilation})):
        llm = LLM(path, skip_tokenizer_init=True, max_model_len=256, device=device,
                  dtype="float32", speculative_config=SPEC, **extra)
        out.append([o.outputs[0].token_ids
                    for o in llm.generate(spec_prompts(), params, use_tqdm=False)])
        spec: SpecDecoder = llm.engine.scheduler.spec
        accepted.append(spec.totals()[2])
        llm.shutdown()
    assert out[1] == out[0]
    assert accepted[1] > 0


@pytest.mark.parametrize("compilation", [{}, {"cudagraph_mode": "FULL"},
                                         {"cudagraph_mode": "NONE"}],
                         ids=["default", "full", "no-graphs"])
def test_gpu_draft_model_equals_cpu(compilation, tiny_model_factory):
    """A draft model (the target itself) drafting on the device beside the target's graphs
    (or, with none, its one-token forwards eager from metadata known on the device only):
    the CPU's greedy tokens, its drafts accepted (the drafter's paged KV right)."""
    from tests.e2e.test_spec_decode import _prompts as spec_prompts
    path, _ = tiny_model_factory("llama")
    spec = {"method": "draft_model", "model": path, "num_speculative_tokens": 3}
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    out, totals = [], []
    for device, extra in (("cpu", {}), ("cuda", {"compilation_config": compilation})):
        llm = LLM(path, skip_tokenizer_init=True, max_model_len=256, device=device,
                  dtype="float32", speculative_config=spec, **extra)
        out.append([o.outputs[0].token_ids
                    for o in llm.generate(spec_prompts(), params, use_tqdm=False)])
        totals.append(llm.engine.scheduler.spec.totals())
        llm.shutdown()
    assert out[1] == out[0]
    # (The target's graphs and the eager drafter round apart: a near-tie may flip.)
    assert totals[1][1] > 0 and totals[1][2] >= 0.95 * totals[1][1]


@pytest.mark.parametrize("compilation", [{}, {"cudagraph_mode": "FULL"}], ids=["default", "full"])
def test_gpu_lora_equals_cpu(compilation, tiny_model_factory, tmp_path):
    """A batch mixing the base model and two adapters (compiled pieces, decode graphs and,
    under FULL, mixed graphs all reading the per-token slot mask) gives the CPU's tokens."""
    from loom.lora.adapter import model_targets
    from loom.lora.dummy import write_dummy_adapter
    from loom.lora.request import LoRARequest
    from loom.models.arch import ModelArch
    from loom.models.loader import resolve
    from loom.config import ModelConfig
    path, _ = tiny_model_factory("llama")
    targets = model_targets(ModelArch.from_hf_config(resolve(ModelConfig(path)).hf_config))
    loras = [LoRARequest(f"a{i}", i, write_dummy_adapter(targets, str(tmp_path / f"a{i}"), 8,
                                                         seed=i)) for i in (1, 2)]
    prompts = _prompts(5, (5, 40, 17, 90, 3, 33))
    per_prompt = [[None, *loras][i % 3] for i in range(len(prompts))]
    out = []
    for device, extra in (("cpu", {}), ("cuda", {"compilation_config": compilation})):
        llm = LLM(path, skip_tokenizer_init=True, max_model_len=256, device=device,
                  dtype="float32", enable_lora=True, max_loras=2, **extra)
        out.append([o.outputs[0].token_ids for o in llm.generate(
            prompts, PARAMS, lora_request=per_prompt, use_tqdm=False)])
        llm.shutdown()
    assert out[1] == out[0]
    base = _tokens(path, device="cpu", dtype="float32")
    assert all((a != b) == (lo is not None) for a, b, lo in zip(out[0], base, per_prompt))


def _fp8_first_tokens_close(path: str, compilation: dict, tolerance: float,
                            same_tokens: bool, **kwargs) -> None:
    """An fp8 model on the GPU against the CPU's float32 multiply of the same fp8 values:
    the first position's logprob of the CPU's token within `tolerance`, and (same_tokens)
    the first two greedy tokens equal. Not float32-close: Hopper's fp8 tensor cores sum a dot's products
    below float32 precision (~1e-4 of a layer's range), per-channel's _scaled_mm writes
    bf16, and the tiny model amplifies both through the next layers' fp8 rounding (measured
    on the H200 in session 39: up to 0.16 block-wise, 0.18-0.32 per channel; 0.0 with the
    CPU's torch ops run on the GPU). A wrong scale or tile moves them by whole units."""
    prompts = _prompts(5, (5, 40, 17, 90, 3, 33))
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=20)
    out = []
    for device, extra in (("cpu", {}), ("cuda", {"compilation_config": compilation})):
        llm = LLM(path, skip_tokenizer_init=True, max_model_len=256, device=device,
                  dtype="float32", **kwargs, **extra)
        out.append(llm.generate(prompts, params, use_tqdm=False))
        llm.shutdown()
    for cpu, gpu in zip(*out):
        if same_tokens:
            assert gpu.outputs[0].token_ids[:2] == cpu.outputs[0].token_ids[:2]
        first_cpu, first_gpu = cpu.outputs[0].logprobs[0], gpu.outputs[0].logprobs[0]
        top = cpu.outputs[0].token_ids[0]
        assert abs(first_gpu[top].logprob - first_cpu[top].logprob) < tolerance


@pytest.mark.parametrize("compilation", [{}, {"level": 0}], ids=["default", "eager"])
def test_gpu_fp8_equals_cpu(compilation, tiny_model_factory):
    """--quantization fp8: torch._scaled_mm, row-wise scales, bf16 out. Its bf16 rounding
    moved a near-tie's argmax in 2 of 6 prompts on the H200 (session 39): the logprobs are
    held, the tokens not."""
    _fp8_first_tokens_close(tiny_model_factory("llama")[0], compilation, 0.5, False,
                            quantization="fp8")


@pytest.mark.parametrize("compilation", [{}, {"level": 0}, {"cudagraph_mode": "FULL"}],
                         ids=["default", "eager", "full"])
def test_gpu_block_fp8_equals_cpu(compilation, tiny_model_factory, tmp_path):
    """A block-wise fp8 checkpoint (Qwen3-8B-FP8's layout, 32 x 32 blocks) through the
    Triton block GEMM (activations quantized per token group on the device, float32 out)."""
    from tests.quantization.fp8_checkpoints import write_block_fp8
    path = write_block_fp8(tiny_model_factory("qwen3")[0], str(tmp_path / "fp8"), [32, 32])
    _fp8_first_tokens_close(path, compilation, 0.25, True)
