"""vLLM's --tool-parser-plugin: a Python file whose classes register more tool parsers
(`tool_parsers.register_tool_parser`), run by the CLI's checks and by every API server."""

from __future__ import annotations

import importlib.util
import os

from loom.entrypoints.openai.tool_parsers import TOOL_PARSERS


def check_tool_parser(name: str | None, plugin: str | None, auto_tool_choice: bool) -> None:
    """The plugin run (if any), then name one of TOOL_PARSERS, which
    --enable-auto-tool-choice needs; ValueError else."""
    if plugin:
        load_tool_parser_plugin(plugin)
    if name is not None and name not in TOOL_PARSERS:
        raise ValueError(f"tool_call_parser: {name!r} is not one of {sorted(TOOL_PARSERS)}")
    if auto_tool_choice and name is None:
        raise ValueError("tool_call_parser: --enable-auto-tool-choice needs --tool-call-parser "
                         f"({', '.join(sorted(TOOL_PARSERS))})")



_LOADED: dict[str, object] = {}
"""The plugin files this process ran, by absolute path, and their modules."""


def load_tool_parser_plugin(path: str) -> None:
    """Run a --tool-parser-plugin file (once per process); a ValueError names a file that
    does not exist or fails to import."""
    key = os.path.abspath(path)
    if key in _LOADED:
        return
    if not os.path.isfile(path):
        raise ValueError(f"tool_parser_plugin: no file {path!r}")
    name = "loom_tool_parser_plugin_" + "".join(c if c.isalnum() else "_" for c in key)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise ValueError(f"tool_parser_plugin: {path} failed to import: "
                         f"{type(e).__name__}: {e}") from None
    _LOADED[key] = module
