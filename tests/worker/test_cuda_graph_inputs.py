"""The CUDA-graph capture runs the forward that the steps compiled, not a second compile."""

import torch

from loom.config import CompilationConfig, EngineConfig, ModelConfig
from loom.forward_context import ForwardContext, forward_context
from loom.worker.cuda_graph import CUDAGraphRunner
from loom.worker.model_runner import ModelRunner


def test_capture_inputs_need_no_recompile(tiny_model_factory):
    """Dynamo guards a compiled graph on its inputs' dispatch keys. The steps' inputs are
    inference tensors; the capture's static buffers were normal ones, so capturing traced
    and compiled the whole forward again (seen on the H200 as a third compile at start-up).
    Sizes of 2 and up only: one token is Dynamo's own specialisation."""
    path, _ = tiny_model_factory("llama")
    config = EngineConfig(ModelConfig(model=path, dtype="float32"),
                          compilation=CompilationConfig(level=3))
    runner = ModelRunner(config, torch.device("cpu"))
    runner.initialize_cache(8)  # traces and compiles the general graph (profile run)
    sizes = [2, 4, 8]
    graphs = CUDAGraphRunner(runner.forward, runner.backend, runner.kv_caches, sizes, 4, 64,
                             torch.device("cpu"))
    ctx = ForwardContext(None, runner.kv_caches, runner.backend)
    with (torch.inference_mode(), forward_context(ctx),
          torch._dynamo.config.patch(error_on_recompile=True)):
        for size in reversed(sizes):  # what capture() runs, minus the CUDA graph itself
            runner.forward(graphs.input_ids[:size], graphs.positions[:size])


def test_running_out_of_memory_in_capture_names_the_setting(tiny_model_factory):
    """The decode graphs take memory after the KV cache is sized: an out-of-memory error
    there becomes a ValueError naming the budget to lower, not a traceback."""
    import pytest
    path, _ = tiny_model_factory("llama")
    runner = ModelRunner(EngineConfig(ModelConfig(model=path, dtype="float32")),
                         torch.device("cpu"))
    runner.initialize_cache(8)

    class OutOfMemory:
        sizes = [1, 2, 4]

        def capture(self):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    runner.graph_runner = OutOfMemory()
    kv_gib = sum(c.numel() * c.element_size() for c in runner.kv_caches) / 2**30
    with pytest.raises(ValueError, match=r"^gpu_memory_utilization \(now 0\.9\): the decode "
                       rf"batches' CUDA graphs \(sizes 1\.\.4\) ran out of GPU memory beside a "
                       rf"{kv_gib:.1f} GiB KV cache; .*--enforce-eager"):
        runner._capture_decode_graphs()
