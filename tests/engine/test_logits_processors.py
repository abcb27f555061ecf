"""Custom logits processors (vLLM's --logits-processors / LLM(logits_processors=...)): the
batch updates they are shown, end to end on a tiny model against transformers' tokens, and
their refusals."""

from __future__ import annotations

import random

import pytest
import torch

from loom import LLM, SamplingParams
from loom.config import EngineConfig, ModelConfig
from loom.logits_processor import MoveDirectionality
from loom.speculative_config import SpeculativeConfig
from loom.worker.input_batch import CachedRequestState
from loom.worker.logits_processors import CustomProcessors, OutputIds
from tests.conftest import hf_greedy
from tests.e2e.test_async_engine import run_spied
from tests.engine import logits_procs
from tests.engine.logits_procs import CALLS, CountUp, TargetToken, TopOne

PROCS = [TargetToken, "tests.engine.logits_procs:TopOne", CountUp]


@pytest.fixture(scope="module")
def model(tiny_model_factory):
    return tiny_model_factory("llama")


@pytest.fixture(scope="module")
def llm(model):
    # 4 sequences at a time for 12 requests of different lengths: requests finish, new
    # ones take their indices, the rest move down.
    llm = LLM(model[0], skip_tokenizer_init=True, dtype="float32", device="cpu",
              max_model_len=128, max_num_seqs=4, logits_processors=PROCS)
    yield llm
    llm.shutdown()


def _state(req_id: str, n: int = 3) -> CachedRequestState:
    return CachedRequestState(req_id, list(range(n)), n, SamplingParams(), [], None)


def test_batch_updates_keep_every_index_on_its_request():
    """Random steps: applying each BatchUpdate as vLLM's model says (removed, added, moved)
    to a plain list gives the processors' batch, and each index's logits row is its
    request's row in the step."""
    procs = CustomProcessors([TargetToken], EngineConfig(ModelConfig("m")),
                             torch.device("cpu"))
    rng = random.Random(0)
    running: list[CachedRequestState] = []
    seen, fresh = [], iter(range(10**6))
    kinds = set()
    for _ in range(300):
        running = [r for r in running if rng.random() > 0.3]  # finished or not sampling
        running += [_state(f"r{next(fresh)}") for _ in range(rng.randrange(3))]
        rng.shuffle(running)
        update = procs._update(running)
        if update is not None:
            for i in update.removed:
                seen[i] = None
            for i, params, prompt, output in update.added:
                seen.extend([None] * (i + 1 - len(seen)))
                seen[i] = next(r.req_id for r in running if r.params is params)
            for a, b, direction in update.moved:
                kinds.add(direction)
                seen[a], seen[b] = (seen[b] if direction is MoveDirectionality.SWAP else None,
                                    seen[a])
            while seen and seen[-1] is None:
                seen.pop()
            assert update.batch_size == len(running)
            kinds |= {"add"} if update.added else set()
            kinds |= {"remove"} if update.removed else set()
        assert seen == procs.slots and sorted(seen) == sorted(r.req_id for r in running)
        order = procs.step(running)._order
        rows = list(range(len(running))) if order is None else order.tolist()
        assert [running[row].req_id for row in rows] == seen
    assert kinds == {"add", "remove", MoveDirectionality.UNIDIRECTIONAL}


def test_output_ids_follow_the_request():
    state = _state("a", 2)
    ids = OutputIds(state)
    assert len(ids) == 0 and list(ids) == []
    state.token_ids += [7, 8, 9]
    assert (len(ids), ids[0], ids[-1], ids[1:], list(ids)) == (3, 7, 9, [8, 9], [7, 8, 9])
    with pytest.raises(IndexError):
        ids[3]


def test_requests_get_their_own_processing_as_the_batch_changes(llm, model):
    path, hf = model
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 256) for _ in range(rng.randrange(3, 20))] for _ in range(12)]
    lengths = [3 + (i * 5) % 9 for i in range(12)]
    args = [{"target_token": 40 + i} if i % 3 == 0 else {"count_from": 100 + i} if i % 3 == 1
            else None for i in range(12)]
    args[2], args[5] = {"after_prompt": True}, {"follow": True}
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, extra_args=a)
              for n, a in zip(lengths, args)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, n, a, out in zip(prompts, lengths, args, outs):
        tokens = out.outputs[0].token_ids
        if a is None:
            assert tokens == hf_greedy(hf, prompt, n)
        elif "target_token" in a:
            assert tokens == [a["target_token"]] * n
        elif "count_from" in a:  # read off the request's own output ids, step by step
            assert tokens == list(range(a["count_from"], a["count_from"] + n))
        elif "follow" in a:  # each read off the last (run ahead: the worker reads it back)
            first = hf_greedy(hf, prompt, 1)[0]
            assert tokens == [(first + k) % 256 for k in range(n)]
        else:
            assert tokens == [(prompt[-1] + 1 + k) % 256 for k in range(n)]


def test_argmax_invariant_processors_act_on_random_rows_only(llm, model):
    path, hf = model
    prompt = [5, 17, 99, 3, 42, 7]
    greedy = hf_greedy(hf, prompt, 8)
    CALLS.clear()
    outs = llm.generate([prompt] * 2, [SamplingParams(temperature=0.0, max_tokens=8,
                                                      ignore_eos=True)] * 2, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [greedy] * 2
    # All greedy: TopOne is told of every batch but never applied; TargetToken applies.
    assert any(c[:2] == ("TopOne", "update") for c in CALLS)
    assert not any(c[:2] == ("TopOne", "apply") for c in CALLS)
    assert any(c[:2] == ("TargetToken", "apply") for c in CALLS)
    random_params = SamplingParams(temperature=1.0, seed=3, max_tokens=8, ignore_eos=True)
    topped, plain = llm.generate(
        [prompt] * 2, [random_params.clone(extra_args={"top_one": True}), random_params],
        use_tqdm=False)
    assert topped.outputs[0].token_ids == greedy  # only the argmax was left to draw
    assert plain.outputs[0].token_ids != greedy  # a real draw: the processor left it alone


def test_bad_params_are_refused_before_the_engine(llm):
    bad = SamplingParams(max_tokens=2, extra_args={"target_token": "x"})
    with pytest.raises(ValueError, match="target_token: must be a token id"):
        llm.generate([[1, 2, 3]], bad, use_tqdm=False)
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, extra_args={"target_token": 9},
                                                   temperature=0.0), use_tqdm=False)
    assert out[0].outputs[0].token_ids == [9, 9]
    with pytest.raises(ValueError, match="extra_args: must be a dict with string keys"):
        SamplingParams(extra_args=[1])


@pytest.mark.parametrize("spec, message", [
    ("tests.engine.logits_procs:Missing", "cannot import it"),
    ("no_such_module:X", "cannot import it"),
    ("TargetToken", "expected module.path:ClassName"),
    ("tests.engine.logits_procs", "not a subclass of"),  # a module
    ("tests.engine.logits_procs:NotAProcessor", "not a subclass of"),
    (logits_procs.NotAProcessor, "not a subclass of"),
])
def test_bad_processor_names_are_clear_errors(spec, message, model):
    with pytest.raises(ValueError, match=f"logits_processors: .*{message}"):
        LLM(model[0], skip_tokenizer_init=True, device="cpu", logits_processors=[spec])


def test_processors_are_refused_where_vllm_refuses_them():
    with pytest.raises(ValueError, match="logits_processors: expected a list"):
        ModelConfig("m", logits_processors=[3])
    with pytest.raises(ValueError, match="not supported with speculative decoding"):
        EngineConfig(ModelConfig("m", logits_processors=[TargetToken]),
                     speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=2,
                                                   prompt_lookup_max=2))
    with pytest.raises(ValueError, match="--runner pooling"):
        EngineConfig(ModelConfig("m", runner="pooling", logits_processors=[TargetToken]))


def test_entry_point_processors_load_and_bad_ones_are_named(tmp_path, monkeypatch):
    """Installed packages' `loom.logits_processors` entry points load beside the named ones,
    as vLLM's `vllm.logits_processors` group does."""
    from loom.logits_processor import load_classes
    dist = tmp_path / "loom_user_procs-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: loom-user-procs\n"
                                   "Version: 1.0\n")
    entries = dist / "entry_points.txt"
    entries.write_text("[loom.logits_processors]\ntop = tests.engine.logits_procs:TopOne\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_classes([TargetToken, "tests.engine.logits_procs:TopOne"]) == [TargetToken, TopOne]
    assert load_classes() == [TopOne]
    entries.write_text("[loom.logits_processors]\nbroken = tests.engine.logits_procs:Nope\n")
    with pytest.raises(ValueError, match="entry point 'broken' \\(loom.logits_processors\\): "
                                         "cannot import it"):
        load_classes()


def test_a_bad_processor_name_is_one_line_before_serve_loads(capsys):
    from loom.cli import main
    assert main(["serve", "no-such-model", "--logits-processors", "no_such_module:X"]) == 2
    err = capsys.readouterr().err
    assert "logits_processors: 'no_such_module:X': cannot import it" in err
    assert "Traceback" not in err


def test_tensor_parallel_processors_run_on_the_driver_rank(model):
    """TP=2 (worker processes, gloo): the classes reach the driver rank's process pickled by
    reference, and only it samples. Requests run ahead of their sampled tokens, with up to
    three steps in flight, and the processors still read their whole outputs."""
    path, hf = model
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
              tensor_parallel_size=2, logits_processors=[TargetToken, CountUp])
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16], [20, 21, 22]]
    args = [{"target_token": 42}, {"count_from": 100}, None, {"follow": True}]
    outs, ahead = run_spied(llm, prompts, [SamplingParams(temperature=0, max_tokens=5,
                                                          ignore_eos=True, extra_args=a)
                                           for a in args], depth=3)
    first = hf_greedy(hf, prompts[3], 1)[0]
    assert [o.outputs[0].token_ids for o in outs] == [
        [42] * 5, [100, 101, 102, 103, 104], hf_greedy(hf, prompts[2], 5),
        [(first + k) % 256 for k in range(5)]]
    assert ahead == {"0", "1", "2", "3"}


def test_a_class_the_tp_workers_cannot_unpickle_is_refused_by_name(model):
    class Local(TargetToken):
        pass
    with pytest.raises(ValueError, match="logits_processors: .*Local cannot reach the tensor "
                                         "parallel workers"):
        LLM(model[0], skip_tokenizer_init=True, device="cpu", tensor_parallel_size=2,
            logits_processors=[Local])
