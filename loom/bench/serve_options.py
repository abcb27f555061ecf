"""`loom bench serve`'s request and record options that vLLM's benchmark has: the sampling
fields sent with every request (--temperature, --top-p, --top-k, --min-p), service-level
objectives for goodput (--goodput), free-form metadata for the result JSON (--metadata) and
how long to wait for a server that is still starting (--ready-check-timeout-sec)."""

from __future__ import annotations

import argparse
from typing import Any

from loom.bench.metrics import parse_goodput


def add_request_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--temperature", type=float, default=None,
                   help="sent with every request (default 0: greedy)")
    g.add_argument("--top-p", type=float, default=None, help="sent with every request")
    g.add_argument("--top-k", type=int, default=None, help="sent with every request")
    g.add_argument("--min-p", type=float, default=None, help="sent with every request")
    g.add_argument("--goodput", nargs="+", default=None, metavar="NAME:MS",
                   help="service-level objectives, e.g. ttft:500 tpot:50 e2el:2000 "
                        "(milliseconds): the requests per second that meet them all are "
                        "reported as request goodput, as vLLM's benchmark does")
    g.add_argument("--metadata", nargs="+", default=None, metavar="KEY=VALUE",
                   help="recorded under `metadata` in the result JSON")
    g.add_argument("--ready-check-timeout-sec", type=float, default=600.0,
                   help="wait up to this long for the server to accept connections (one "
                        "started beside the benchmark may still be loading); 0: one try")


def sampling_fields(ns: argparse.Namespace) -> dict[str, Any]:
    """The sampling fields given, checked: temperature >= 0, top_p in (0, 1], top_k -1
    or >= 1, min_p in [0, 1]."""
    fields = {name: getattr(ns, name) for name in ("temperature", "top_p", "top_k", "min_p")
              if getattr(ns, name, None) is not None}
    checks = {"temperature": lambda v: v >= 0, "top_p": lambda v: 0 < v <= 1,
              "top_k": lambda v: v == -1 or v >= 1, "min_p": lambda v: 0 <= v <= 1}
    for name, value in fields.items():
        if not checks[name](value):
            raise ValueError(f"{name}: {value} is out of range (temperature >= 0, top_p in "
                             "(0, 1], top_k -1 or >= 1, min_p in [0, 1])")
    return fields


def goodput_objectives(ns: argparse.Namespace) -> dict[str, float]:
    return parse_goodput(getattr(ns, "goodput", None) or [])


def metadata(ns: argparse.Namespace) -> dict[str, str]:
    out = {}
    for item in getattr(ns, "metadata", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"metadata: {item!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out
