"""vLLM's --pooler-config (once --override-pooler-config): the server's pooling defaults,
over what the model's own files say (torch-free: the engine core and the API process read
it alike).

- pooling_type (CLS, LAST or MEAN): how every embedding is pooled, over the model's
  sentence-transformers Pooling module and the architecture's default;
- normalize: whether an embedding request that leaves `normalize` unset is L2-normalised
  (default true);
- dimensions: the matryoshka size an embedding request that leaves `dimensions` unset
  gets;
- use_activation: whether a classify or score request that leaves `use_activation` unset
  gets the model's activation (default true).

vLLM's token-wise pooling (ALL, STEP) and its other fields are refused by name.
"""

from __future__ import annotations

from typing import Any

POOLING_TYPES = {"CLS": "cls", "LAST": "last", "MEAN": "mean"}
_FIELDS = ("pooling_type", "normalize", "dimensions", "use_activation")


def check_pooler_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config, each field checked; a ValueError naming a field loom does not apply."""
    unknown = sorted(set(config) - set(_FIELDS))
    if unknown:
        raise ValueError(f"pooler_config.{unknown[0]}: not a field loom applies "
                         f"({', '.join(_FIELDS)})")
    kind = config.get("pooling_type")
    if kind is not None and str(kind).upper() not in POOLING_TYPES:
        raise ValueError(f"pooler_config.pooling_type: {kind!r} is not one of "
                         f"{', '.join(POOLING_TYPES)} (loom pools whole sequences only)")
    for name in ("normalize", "use_activation"):
        if config.get(name) is not None and not isinstance(config[name], bool):
            raise ValueError(f"pooler_config.{name}: must be true or false, got "
                             f"{config[name]!r}")
    dims = config.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims < 1):
        raise ValueError(f"pooler_config.dimensions: must be a positive integer, got {dims!r}")
    return dict(config)


def pooling_type(config: dict[str, Any]) -> str | None:
    kind = config.get("pooling_type")
    return None if kind is None else POOLING_TYPES[str(kind).upper()]
