"""The Triton backend's fused rotary + cache write, end to end: the model runner moves rotary
into the attention op for it, and a tiny model then generates exactly what it generates with
rotary in the model (and what transformers does). The kernels run interpreted on the CPU.
"""

from collections import Counter

import pytest
import torch

pytest.importorskip("triton")

from loom import LLM, SamplingParams  # noqa: E402
from loom.attention import triton_backend  # noqa: E402
from loom.attention.triton_backend import TritonBackend  # noqa: E402
from loom.compilation.backend import DEFAULT_SPLITTING_OPS, split_graph  # noqa: E402
from loom.config import EngineConfig, ModelConfig  # noqa: E402
from loom.forward_context import ForwardContext, forward_context  # noqa: E402
from loom.layers.attention import set_fused_rope  # noqa: E402
from loom.worker import model_runner as model_runner_module  # noqa: E402
from loom.worker.model_loader import load_model  # noqa: E402
from tests.conftest import hf_greedy  # noqa: E402
from tests.e2e.test_correctness import _prompts  # noqa: E402
from tests.triton_interpreter import patch_interpreter  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="runs the Triton kernels on CPU tensors, interpreted")
if not torch.cuda.is_available():
    patch_interpreter()

NEW_TOKENS = 6


def _generate(path, prompts):
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True,
                            logprobs=20)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.outputs[0] for o in outs]


@pytest.mark.parametrize("kind", ["llama", "qwen3"])  # qwen3: q/k norm before rotary
def test_fused_rope_generates_what_unfused_does(kind, tiny_model_factory, monkeypatch):
    path, hf = tiny_model_factory(kind)
    monkeypatch.setattr(model_runner_module, "select_backend", lambda device: TritonBackend())
    monkeypatch.setattr(model_runner_module, "warm_up", lambda runner: None)  # not under test
    calls = Counter()
    for name in ("write_kv_cache", "rope_write_kv_cache", "gather_kv"):
        real = getattr(triton_backend, name)
        monkeypatch.setattr(triton_backend, name, lambda *a, _real=real, _name=name, **kw: (
            calls.update([_name]), _real(*a, **kw))[1])
    real_decode = triton_backend.paged_decode
    monkeypatch.setattr(triton_backend, "paged_decode", lambda *a, **kw: (
        calls.update(["decode, rotating itself" if kw.get("new_tokens") else "decode"]),
        real_decode(*a, **kw))[1])
    prompts = _prompts(seed=3, lengths=(5, 21))  # 21 spans two cache blocks

    fused = _generate(path, prompts)
    assert calls["rope_write_kv_cache"] > 0 and calls["write_kv_cache"] == 0
    # Decode steps rotate and write inside the decode kernel, with no launch before it.
    assert calls["decode, rotating itself"] > 0 and calls["decode"] == 0
    # Both prompts are fresh prefills in one step: SDPA attends over the keys and values
    # the rotary kernel also wrote out, none read back from the cache.
    assert calls["gather_kv"] == 0
    calls.clear()
    monkeypatch.setattr(TritonBackend, "fuses_rope", False)
    unfused = _generate(path, prompts)
    assert calls["write_kv_cache"] > 0 and calls["rope_write_kv_cache"] == 0
    assert calls["gather_kv"] == 0

    for prompt, a, b in zip(prompts, fused, unfused):
        assert a.token_ids == b.token_ids == hf_greedy(hf, prompt, NEW_TOKENS)
        for step_a, step_b in zip(a.logprobs, b.logprobs):
            # float32, interpreted: the kernel's rotation is torch's, bit for bit.
            assert {t: p.logprob for t, p in step_a.items()} == \
                {t: p.logprob for t, p in step_b.items()}


def test_traced_graph_takes_rotary_into_the_split_attention_op(tiny_model_factory):
    """torch.compile traces the flag's choice: with it on, every `loom::attention` call gets
    positions and the rotary table, the graph has no rotary arithmetic of its own, and
    level 3 still splits at each attention call."""
    path, _ = tiny_model_factory("llama")
    model, arch, _ = load_model(EngineConfig(ModelConfig(model=path, dtype="float32")),
                                torch.device("cpu"))
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm

    ids = torch.zeros(4, dtype=torch.long)
    ctx = ForwardContext(None, [], TritonBackend())
    for fused in (False, True):
        set_fused_rope(model, fused)
        torch._dynamo.reset()
        with forward_context(ctx), torch.inference_mode():
            torch.compile(model.forward, backend=record, fullgraph=True)(ids, ids)
    unfused_graph, fused_graph = graphs

    for gm, fused in ((unfused_graph, False), (fused_graph, True)):
        calls = [n for n in gm.graph.nodes if n.op == "call_function"
                 and str(n.target).startswith("loom.attention")]
        assert len(calls) == arch.num_layers
        assert all((len(n.args) > 5 and n.args[5] is not None) == fused for n in calls)
        rotations = [n for n in gm.graph.nodes if n.target is torch.cat]  # one a layer
        assert len(rotations) == (0 if fused else arch.num_layers)
        _, pieces = split_graph(gm, DEFAULT_SPLITTING_OPS)
        assert len(pieces) == arch.num_layers
