"""Host time the API server spends splitting a streamed output, per whole stream: a tool
call with large arguments (a file write) in each parser's syntax (hermes, llama3_json,
pythonic), fifty small calls in each, and a long thinking block, each fed in 4-character
pieces as tokens arrive. Prints JSON (device, commit, command, figures).

Run at two commits to compare: python benchmarks/cpu/stream_parse_costs.py
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time


def _best(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _call_text(parser: str, calls: list[tuple[str, dict]]) -> str:
    """The calls as the parser's models write them."""
    if parser == "hermes":
        return "\n".join('<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>'
                         % (name, json.dumps(args)) for name, args in calls)
    if parser == "llama3_json":
        return "<|python_tag|>" + "; ".join('{"name": "%s", "parameters": %s}'
                                            % (name, json.dumps(args)) for name, args in calls)
    return "[" + ", ".join(name + "(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"
                           for name, args in calls) + "]"


def tool_call_stream(parser: str, calls: list[tuple[str, dict]]) -> tuple[int, float]:
    from loom.entrypoints.openai.tool_calls import ToolCalls
    from loom.entrypoints.openai.tool_parsers import TOOL_PARSERS
    text = _call_text(parser, calls)

    def run():
        stream = ToolCalls("auto", TOOL_PARSERS[parser]()).stream()
        for i in range(0, len(text), 4):
            stream.feed(text[i:i + 4])
        stream.end("stop")
    return len(text), _best(run)


def file_write(kb_target: int) -> list[tuple[str, dict]]:
    line = "def f(x):\n    return {'a': [x, \"q\\\\n\"]}\n"
    code = line * (kb_target * 1024 // len(line))
    return [("write_file", {"path": "a.py", "content": code})]


def small_calls(n: int) -> list[tuple[str, dict]]:
    return [("get_weather", {"city": f"City {i}", "days": i % 7, "units": "metric"})
            for i in range(n)]


def thinking_stream(kb_target: int) -> tuple[int, float]:
    from loom.entrypoints.openai.reasoning import REASONING_PARSERS, ReasoningStream
    sentence = "Let me think about this step by step. "
    text = ("<think>" + sentence * (kb_target * 1024 // len(sentence)) + "</think>\n\nThe "
            "answer is 42.")

    def run():
        stream = ReasoningStream(REASONING_PARSERS["qwen3"])
        for i in range(0, len(text), 4):
            stream.feed(text[i:i + 4])
        stream.end()
    return len(text), _best(run)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.machine()
    return f"{model} ({os.cpu_count()} CPUs)"


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    figures = {}
    for parser in ("hermes", "llama3_json", "pythonic"):
        for name, calls in (("call_9kb", file_write(9)), ("call_36kb", file_write(36)),
                            ("50_calls", small_calls(50))):
            n, s = tool_call_stream(parser, calls)
            figures[f"{parser}_{name}"] = {"chars": n, "pieces": -(-n // 4),
                                           "ms": round(s * 1e3, 1)}
    for kb in (40, 160):
        n, s = thinking_stream(kb)
        figures[f"thinking_{kb}kb"] = {"chars": n, "pieces": -(-n // 4), "ms": round(s * 1e3, 1)}
    print(json.dumps({"benchmark": "stream_parse_costs", "device": cpu_name(), "python": platform.python_version(),
                      "git_commit": commit, "command": " ".join(["python", *sys.argv]),
                      "ceilings": None, "figures": figures}, indent=1))


if __name__ == "__main__":
    main()
