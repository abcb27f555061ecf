"""The Triton backend's fused rotary + cache write, end to end: the model runner moves rotary
into the attention op for it, and a tiny model then generates exactly what it generates with
rotary in the model (and what transformers does); SmolLM3's NoPE layers are rotated on
neither path. The kernels run interpreted on the CPU.
"""

from collections import Counter

import pytest
import torch

pytest.importorskip("triton")

from loom import LLM, SamplingParams  # noqa: E402
from loom.attention import triton_backend  # noqa: E402
from loom.attention.triton_backend import TritonBackend, TritonTiles  # noqa: E402
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

NEW_TOKENS = 4  # three decode steps: the interpreter's cost is per kernel launch


def _generate(path, prompts):
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True,
                            logprobs=20)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.outputs[0] for o in outs]


# qwen3: q/k norm, in the kernels too; smollm3: layers 1 and 3 of 4 NoPE
@pytest.mark.parametrize("kind", ["llama", "qwen3", "smollm3"])
def test_fused_rope_generates_what_unfused_does(kind, tiny_model_factory, monkeypatch):
    path, hf = tiny_model_factory(kind)
    # SDPA for the fresh prompts however short (the default takes 2048 tokens and up)
    monkeypatch.setattr(model_runner_module, "select_backend",
                        lambda device: TritonBackend(TritonTiles(sdpa_min_tokens=0)))
    monkeypatch.setattr(model_runner_module, "warm_up", lambda runner: None)  # not under test
    calls = Counter()
    for name in ("write_kv_cache", "rope_write_kv_cache", "gather_kv"):
        real = getattr(triton_backend, name)
        monkeypatch.setattr(triton_backend, name, lambda *a, _real=real, _name=name, **kw: (
            calls.update([_name] + (["normalising"] if kw.get("qk_norm") else [])),
            _real(*a, **kw))[1])
    real_decode = triton_backend.paged_decode
    monkeypatch.setattr(triton_backend, "paged_decode", lambda *a, **kw: (
        calls.update(["decode, rotating itself" if kw.get("new_tokens") else "decode"]
                     + (["decode, normalising"] if kw.get("new_tokens")
                        and kw["new_tokens"].qk_norm else [])),
        real_decode(*a, **kw))[1])
    prompts = _prompts(seed=3, lengths=(5, 21))  # 21 spans two cache blocks

    fused = _generate(path, prompts)
    # Decode steps rotate and write inside the decode kernel, with no launch before it.
    assert calls["rope_write_kv_cache"] > 0 and calls["decode, rotating itself"] > 0
    # SmolLM3's NoPE layers, as many as its rotating ones, hand the attention op no
    # positions: a plain cache write in every step and a decode kernel that rotates nothing.
    nope = kind == "smollm3"
    assert calls["write_kv_cache"] == (calls["rope_write_kv_cache"] + calls["decode"]
                                       if nope else 0)
    assert calls["decode"] == (calls["decode, rotating itself"] if nope else 0)
    # Qwen3's q/k norm goes into both kernels with the rotation (no norm kernel before).
    normalises = kind == "qwen3"
    assert (calls["normalising"] == calls["rope_write_kv_cache"]) == normalises
    assert (calls["decode, normalising"] == calls["decode, rotating itself"]) == normalises
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
            fused_lp = {t: p.logprob for t, p in step_a.items()}
            unfused_lp = {t: p.logprob for t, p in step_b.items()}
            if kind != "qwen3":
                # float32, interpreted: the kernel's rotation is torch's, bit for bit.
                assert fused_lp == unfused_lp
            else:  # the kernels' q/k norm sums its squares in another order than torch
                assert fused_lp.keys() == unfused_lp.keys()
                assert fused_lp == pytest.approx(unfused_lp, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("kind", ["llama", "qwen3", "smollm3"])
def test_traced_graph_takes_rotary_into_the_split_attention_op(kind, tiny_model_factory):
    """torch.compile traces the flag's choice: with it on, every `loom::attention` call gets
    positions and the rotary table (and Qwen3's q/k norm weights), the graph has no rotary
    arithmetic (nor q/k norm) of its own, and level 3 still splits at each attention call.
    SmolLM3's NoPE layers rotate on neither path: no rotary arithmetic, and no positions or
    table for the op, whose backend then only writes the cache."""
    path, _ = tiny_model_factory(kind)
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
        rotating = [arch.uses_rope(i) for i in range(arch.num_layers)]
        assert rotating == ([True, False] * 2 if kind == "smollm3" else [True] * 2)
        assert [len(n.args) > 5 and n.args[5] is not None for n in calls] == \
            [fused and r for r in rotating]
        normed = fused and kind == "qwen3"
        assert all((len(n.args) > 8 and n.args[7] is not None) == normed for n in calls)
        rotations = [n for n in gm.graph.nodes if n.target is torch.cat]  # q and k, or qk
        assert len(rotations) == (0 if fused else sum(rotating) * (1 + (kind == "qwen3")))
        # Norms without a residual: the first layer's input norm, and q/k norms unless the
        # attention op takes them.
        norms = [n for n in gm.graph.nodes if n.op == "call_function"
                 and str(n.target).startswith("loom.rms_norm")]
        assert len(norms) == 1 + (2 * arch.num_layers if kind == "qwen3" and not fused else 0)
        _, pieces = split_graph(gm, DEFAULT_SPLITTING_OPS)
        assert len(pieces) == arch.num_layers


def test_attention_op_takes_q_and_k_norm_together_and_with_positions():
    q = torch.zeros(2, 8)
    w = torch.ones(4)
    with pytest.raises(ValueError, match="q_norm and k_norm come together"):
        torch.ops.loom.attention(q, q, q, 0, 1.0, torch.zeros(2).long(), torch.zeros(8, 4), w)
    with pytest.raises(ValueError, match="with positions"):
        torch.ops.loom.attention(q, q, q, 0, 1.0, None, None, w, w, 1e-6)
