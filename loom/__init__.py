"""loom: a fast LLM inference and serving engine with vLLM's interfaces."""

from __future__ import annotations

__version__ = "0.1.0"

_OUTPUTS = ("RequestOutput", "CompletionOutput", "EmbeddingRequestOutput",
            "ClassificationRequestOutput", "ScoringRequestOutput", "PoolingRequestOutput")
"""`loom.outputs`' classes, exported at the top as vLLM exports them."""
__all__ = ["LLM", "SamplingParams", "PoolingParams", "BeamSearchParams", "CompilationConfig",
           "PassConfig", "EngineArgs", *_OUTPUTS, "__version__"]


def __getattr__(name: str):
    # Lazy, so that `import loom.sampling_params` in the API process never pulls in torch.
    if name == "LLM":
        from loom.entrypoints.llm import LLM
        return LLM
    if name == "SamplingParams":
        from loom.sampling_params import SamplingParams
        return SamplingParams
    if name == "BeamSearchParams":
        from loom.beam_search import BeamSearchParams
        return BeamSearchParams
    if name == "PoolingParams":  # as vLLM exports it
        from loom.pooling_params import PoolingParams
        return PoolingParams
    if name in ("CompilationConfig", "PassConfig"):
        from loom import config
        return getattr(config, name)
    if name in _OUTPUTS:
        from loom import outputs
        return getattr(outputs, name)
    if name == "EngineArgs":
        from loom.engine.arg_utils import EngineArgs
        return EngineArgs
    raise AttributeError(f"module 'loom' has no attribute {name!r}")
