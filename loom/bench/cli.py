"""`loom bench latency | throughput | serve | sweep | async-tp | moe | attention | int4 |
w8a8`."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from loom.bench.common import check_outputs


def register(subparsers) -> None:
    from loom.bench import (async_tp, attention, int4, latency, moe, serve, sweep,
                            throughput, w8a8)
    p = subparsers.add_parser("bench",
                              help="benchmarks: latency, throughput, serve, sweep, async-tp, moe, "
                                   "attention, int4, w8a8")
    sub = p.add_subparsers(dest="bench_command", required=True,
                           metavar="{latency,throughput,serve,sweep,async-tp,moe,attention,int4,"
                                   "w8a8}")
    for module in (latency, throughput, serve, sweep, async_tp, moe, attention, int4, w8a8):
        module.register(sub)
    for bench in sub.choices.values():
        bench.set_defaults(func=_outputs_checked_first(bench.get_default("func")))
    p.set_defaults(func=_missing_subcommand)


def _outputs_checked_first(run: Callable[[argparse.Namespace], int]):
    """An unwritable --output-json is an error before the benchmark runs, not after."""
    def checked(args: argparse.Namespace) -> int:
        check_outputs(args)
        return run(args)
    return checked


def _missing_subcommand(args: argparse.Namespace) -> int:
    raise ValueError("bench: name a benchmark: latency, throughput, serve, sweep, async-tp, moe, "
                     "attention, int4 or w8a8")
