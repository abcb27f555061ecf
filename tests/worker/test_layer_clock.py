"""LOOM_LAYER_TIMES: per-layer host time against GPU time, and which bounds the step."""

from __future__ import annotations

import logging

import pytest
import torch

from loom import LLM, SamplingParams
from loom.worker.layer_clock import summarize


def test_a_gpu_waiting_on_launches_reads_as_host_bound():
    # The GPU's gap between layers follows the host's when it waits for each launch.
    line = summarize(2048, host_ms=[1.10, 1.00, 1.05, 0.98], gpu_ms=[1.12, 1.01, 1.06, 1.00])
    assert "4 layers" in line and "host 1.025 ms, GPU 1.035 ms" in line
    assert "bound by the host" in line


def test_a_host_running_ahead_reads_as_gpu_bound():
    line = summarize(8192, host_ms=[0.30, 0.35, 0.32], gpu_ms=[3.4, 3.5, 3.5])
    assert "host 0.320 ms, GPU 3.500 ms" in line and "bound by the GPU" in line
    assert "host 1.0 ms, GPU 10.4 ms" in line  # the spans: sums of the gaps


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_eager_prefill_logs_its_layer_times(tiny_model_factory, monkeypatch, caplog):
    monkeypatch.setenv("LOOM_LAYER_TIMES", "1")
    path, _ = tiny_model_factory("llama")
    caplog.set_level(logging.INFO, logger="loom.worker.step_handle")
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cuda", max_model_len=128,
              kv_cache_memory_bytes=1 << 28, enforce_eager=True)
    llm.generate([list(range(3, 40))], SamplingParams(max_tokens=2, ignore_eos=True),
                 use_tqdm=False)
    assert "layer times: 37 tokens, 2 layers" in caplog.text  # two attention gaps + the end
