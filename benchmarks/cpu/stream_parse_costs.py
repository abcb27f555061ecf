"""Host time the API server spends splitting a streamed output, per whole stream: a hermes
tool call with large arguments (a file write) and a long thinking block, each fed in
4-character pieces as tokens arrive. Prints JSON (device, commit, command, figures).

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


def tool_call_stream(kb_target: int) -> tuple[int, float]:
    from loom.entrypoints.openai.tool_calls import ToolCalls
    from loom.entrypoints.openai.tool_parsers import HermesParser
    line = "def f(x):\n    return {'a': [x, \"q\\\\n\"]}\n"
    code = line * (kb_target * 1024 // len(line))
    text = ('<tool_call>\n{"name": "write_file", "arguments": '
            + json.dumps({"path": "a.py", "content": code}) + "}\n</tool_call>")

    def run():
        stream = ToolCalls("auto", HermesParser()).stream()
        for i in range(0, len(text), 4):
            stream.feed(text[i:i + 4])
        stream.end("stop")
    return len(text), _best(run)


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
    for kb in (9, 36):
        n, s = tool_call_stream(kb)
        figures[f"hermes_call_{kb}kb"] = {"chars": n, "pieces": -(-n // 4), "ms": round(s * 1e3, 1)}
    for kb in (40, 160):
        n, s = thinking_stream(kb)
        figures[f"thinking_{kb}kb"] = {"chars": n, "pieces": -(-n // 4), "ms": round(s * 1e3, 1)}
    print(json.dumps({"benchmark": "stream_parse_costs", "device": cpu_name(), "python": platform.python_version(),
                      "git_commit": commit, "command": " ".join(["python", *sys.argv]),
                      "ceilings": None, "figures": figures}, indent=1))


if __name__ == "__main__":
    main()
