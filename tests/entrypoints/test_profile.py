"""vLLM's profiler controls: `LLM.start_profile()` / `stop_profile()` and the server's POST
/start_profile, /stop_profile (routes present only with LOOM_TORCH_PROFILER_DIR set). A
profile is torch.profiler's own Chrome trace of the steps between, in a folder of its own;
out-of-order calls are refused by name, and the engine serves on unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loom import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def _ops(folder: Path) -> set[str]:
    """The names of the host ops torch.profiler recorded in rank 0's trace."""
    events = json.loads((folder / "trace-rank0.json").read_text())["traceEvents"]
    assert (folder / "ops-rank0.txt").read_text().strip()
    return {e.get("name", "") for e in events if e.get("ph") == "X"}


def test_llm_profiles_the_steps_between(llm, monkeypatch, tmp_path):
    expected = llm.generate("Hello there", GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    monkeypatch.delenv("LOOM_TORCH_PROFILER_DIR", raising=False)
    with pytest.raises(ValueError, match="set LOOM_TORCH_PROFILER_DIR"):
        llm.start_profile()
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("LOOM_TORCH_PROFILER_DIR", str(tmp_path / "a-file"))
    with pytest.raises(ValueError, match="^LOOM_TORCH_PROFILER_DIR: cannot write profiles to "):
        llm.start_profile()
    monkeypatch.setenv("LOOM_TORCH_PROFILER_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="^profile: no profile is running"):
        llm.stop_profile()
    llm.start_profile()
    with pytest.raises(ValueError, match="^profile: a profile is already running"):
        llm.start_profile()
    out = llm.generate("Hello there", GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    folder = Path(llm.stop_profile())
    assert folder.parent == tmp_path and out == expected
    assert any(name.startswith("aten::") for name in _ops(folder))
    llm.start_profile()  # a second profile: a folder of its own
    second = Path(llm.stop_profile())
    assert second != folder and (second / "trace-rank0.json").exists()
    assert llm.generate("Hello there", GREEDY, use_tqdm=False)[0].outputs[0].token_ids == expected


def test_server_profiles_between_its_routes(parsing_server):
    s = parsing_server
    with s.http(timeout=60) as http:
        refused = http.post("/stop_profile")
        assert refused.status_code == 400
        assert "no profile is running" in refused.json()["error"]["message"]
        assert http.post("/start_profile").status_code == 200
        assert http.post("/start_profile").status_code == 400
        done = s.client().completions.create(model=s.client().models.list().data[0].id,
                                             prompt="Hello", max_tokens=3)
        assert done.choices[0].text is not None
        assert http.post("/stop_profile").status_code == 200
    (folder,) = list(s.profiles.iterdir())
    assert any(name.startswith("aten::") for name in _ops(folder))


@pytest.mark.parametrize("server", ["mp"], indirect=True)  # one mode: the routes' choice
def test_profiler_routes_are_absent_without_the_variable(server):
    with server.http(timeout=30) as http:
        assert http.post("/start_profile").status_code == 404
        assert http.post("/stop_profile").status_code == 404
