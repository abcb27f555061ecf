"""Mixed steps through the Triton backend, end to end: with chunked prefill, decodes run
beside prompt chunks, and the backend splits each such step (decodes to the split-K
kernels, chunks to the varlen kernel, each over a request index). A tiny model must still
generate what transformers does; so must Gemma 3 (sliding-window layers beside a global one,
q/k norms before the kernels' rotation, a rotary table per kind of layer). The kernels run
interpreted on the CPU."""

from collections import Counter

import pytest
import torch

pytest.importorskip("triton")

from loom import LLM, SamplingParams  # noqa: E402
from loom.attention import triton_backend  # noqa: E402
from loom.attention.triton_backend import TritonBackend  # noqa: E402
from loom.worker import model_runner as model_runner_module  # noqa: E402
from tests.conftest import hf_greedy  # noqa: E402
from tests.e2e.test_correctness import _prompts  # noqa: E402
from tests.triton_interpreter import patch_interpreter  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="runs the Triton kernels on CPU tensors, interpreted")
if not torch.cuda.is_available():
    patch_interpreter()

NEW_TOKENS = 5


@pytest.mark.parametrize("kind", ["llama", "gemma3"])  # GQA group 2
def test_split_mixed_steps_generate_what_transformers_does(kind, tiny_model_factory,
                                                           monkeypatch):
    path, hf = tiny_model_factory(kind)
    monkeypatch.setenv("LOOM_MIXED_SPLIT_MIN_DECODES", "1")  # a few decodes split too
    monkeypatch.setattr(model_runner_module, "select_backend", lambda device: TritonBackend())
    monkeypatch.setattr(model_runner_module, "warm_up", lambda runner: None)  # not under test
    calls = Counter()
    for name in ("paged_decode", "paged_prefill"):
        real = getattr(triton_backend, name)

        def spy(*a, _real=real, _name=name, **kw):
            # a short prompt chunk (at most 8 tokens) takes the decode kernel at q_tokens
            kind = "short" if kw.get("q_tokens", 1) > 1 else _name
            calls[(kind, kw.get("req_index") is not None)] += 1
            return _real(*a, **kw)
        monkeypatch.setattr(triton_backend, name, spy)

    # 16 tokens a step: the short prompts finish their prefill first and decode while the
    # long ones are still being chunked (after their own cached context).
    prompts = _prompts(seed=5, lengths=(4, 40, 6, 30))
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
              max_num_batched_tokens=16, enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)

    assert calls[("paged_decode", True)] > 0 and calls[("short", True)] > 0, calls
    assert calls[("paged_decode", True)] == \
        calls[("paged_prefill", True)] + calls[("short", True)], calls
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, NEW_TOKENS)
