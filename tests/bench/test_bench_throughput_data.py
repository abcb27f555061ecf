"""`loom bench throughput`'s request mixes beyond fixed random prompts: vLLM's
--random-range-ratio and --n, and --dataset-name sharegpt, on a tiny model with the real
Llama 3 tokenizer on the CPU."""

from __future__ import annotations

import json

from loom.bench import ceilings as ceilings_module
from loom.cli import main
from tests.bench.test_bench_offline import FAKE


def test_throughput_random_range_ratio_and_sharegpt(tiny_llama_with_tokenizer, tmp_path,
                                                     capsys, monkeypatch):
    """--random-range-ratio spreads the random requests' lengths (each output as long as
    drawn: ignore_eos; --n completions of each); --dataset-name sharegpt sends each
    conversation's first human turn as text and generates its reply's length; a ShareGPT
    request past max_model_len is refused before the run."""
    from loom.bench.datasets import count_tokens
    from loom.frontend.tokenizer import load_tokenizer
    path = tiny_llama_with_tokenizer[0]
    monkeypatch.setattr(ceilings_module, "measure_ceilings", lambda device, **kw: FAKE)
    out = tmp_path / "r.json"
    base = ["bench", "throughput", "--model", path, "--device", "cpu", "--max-model-len", "128",
            "--output-json", str(out)]
    assert main(base + ["--input-len", "10", "--output-len", "8", "--num-prompts", "12",
                        "--random-range-ratio", "0.5"]) == 0
    r = json.loads(out.read_text())
    assert r["num_requests"] == 12 and r["random_range_ratio"] == 0.5
    spread = r["output_tokens"]
    assert main(base + ["--input-len", "10", "--output-len", "8", "--num-prompts", "12",
                        "--random-range-ratio", "0.5", "--n", "3"]) == 0
    assert json.loads(out.read_text())["output_tokens"] == 3 * spread  # same seed: lengths
    assert 12 * 5 <= r["prompt_tokens"] <= 12 * 15 and r["prompt_tokens"] != 120
    assert 12 * 4 <= r["output_tokens"] <= 12 * 12 and r["output_tokens"] != 96
    words = "river stone amber lantern quiet harbor silver meadow".split()
    conversations = [{"conversations": [
        {"from": "human", "value": " ".join(words[i % 8:] + words[:i % 8])},
        {"from": "gpt", "value": " ".join(words[:4 + i % 4])}]} for i in range(6)]
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(conversations))
    assert main(base + ["--dataset-name", "sharegpt", "--dataset-path", str(data),
                        "--num-prompts", "6"]) == 0
    r = json.loads(out.read_text())
    tok = load_tokenizer(path)
    replies = sum(count_tokens(tok, c["conversations"][1]["value"]) for c in conversations)
    prompts = sum(len(tok.encode(c["conversations"][0]["value"])) for c in conversations)
    assert r["dataset_name"] == "sharegpt" and r["num_requests"] == 6
    assert r["output_tokens"] == replies and r["prompt_tokens"] == prompts
    capsys.readouterr()
    assert main(base[:-4] + ["--max-model-len", "12", "--dataset-name", "sharegpt",
                             "--dataset-path", str(data), "--num-prompts", "6"]) == 2
    assert "ShareGPT requests need more than 12 tokens" in capsys.readouterr().err
    assert main(base + ["--dataset-name", "sharegpt"]) == 2
    assert "pass --dataset-path" in capsys.readouterr().err
