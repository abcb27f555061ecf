"""`loom generate | serve | run-batch | chat | complete | bench ...`: vLLM's commands."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from loom.cli_config import expand_config


def _generate_parser(sub) -> None:
    from loom.engine.arg_utils import EngineArgs
    p = sub.add_parser("generate", help=_COMMANDS["generate"][0])
    p.add_argument("--prompt", action="append", required=True, help="repeat for several prompts")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--chat-template", default=None,
                   help="a Jinja chat template, or a file holding one; overrides the model's")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--sampling-seed", type=int, default=None)
    EngineArgs.add_cli_args(p)
    p.set_defaults(func=_run_generate)


def _run_generate(args: argparse.Namespace) -> int:
    from loom.engine.arg_utils import EngineArgs
    from loom.entrypoints.llm import LLM
    from loom.sampling_params import SamplingParams
    engine_args = EngineArgs.from_cli_args(args)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, seed=args.sampling_seed)
    llm = LLM(**vars(engine_args), chat_template=args.chat_template)
    if args.chat:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompt], params)
    else:
        outputs = llm.generate(args.prompt, params)
    for prompt, out in zip(args.prompt, outputs):
        print(f"Prompt: {prompt!r}\nOutput: {out.outputs[0].text!r}\n")
    return 0


class _Parser(argparse.ArgumentParser):
    """The root parser: vLLM's spellings of the compilation config (`-O3`,
    `-O.cudagraph_mode=NONE`, `-cc.compile_sizes+ 8` ...) become one `--compilation-config`
    first (`engine/json_flags.py`), and long flags may be written with underscores
    (`--max_model_len`), as vLLM's parser takes them."""

    def parse_known_args(self, args=None, namespace=None):
        from loom.engine.json_flags import fold_compilation_flags
        try:
            args = fold_compilation_flags(_dashed(sys.argv[1:] if args is None else args))
        except ValueError as e:
            self.error(str(e))
        return super().parse_known_args(args, namespace)


def _dashed(argv: list[str]) -> list[str]:
    """`--max_model_len 8` as `--max-model-len 8`: the flag's name up to any `.` (a JSON
    key such as `--compilation-config.cudagraph_mode` keeps its own) or `=`; nothing after a
    bare `--`."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--":
            break
        if arg.startswith("--") and "_" in arg:
            name, sep, rest = arg.partition("=")
            head, dot, tail = name.partition(".")
            out[i] = head.replace("_", "-") + dot + tail + sep + rest
    return out


# Each command's one-line help, and where its parser is built (a module's `register`; None:
# here).
_COMMANDS = {
    "generate": ("generate text offline for one or more prompts", None),
    "serve": ("serve a model over an OpenAI-compatible HTTP API", "loom.entrypoints.openai.cli"),
    "run-batch": ("answer a file of OpenAI batch requests (JSONL) offline",
                  "loom.entrypoints.openai.run_batch"),
    "chat": ("chat with a running server's model", "loom.entrypoints.cli_client"),
    "complete": ("complete prompts on a running server", "loom.entrypoints.cli_client"),
    "bench": ("benchmarks: latency, throughput, serve, sweep, async-tp, moe, attention, int4, "
              "w8a8", "loom.bench.cli"),
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; given argv, only the named command's parser is whole and the
    others are their help line (`serve` imports FastAPI, `bench` aiohttp: ~0.6 s that
    `loom --version`, `loom chat` and `loom complete` need not spend)."""
    from loom import __version__
    parser = _Parser(prog="loom", description=__doc__)
    parser.add_argument("-v", "--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True,
                                parser_class=argparse.ArgumentParser)
    named = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    whole = {m for c, (_, m) in _COMMANDS.items() if named is None or c == named}
    for command, (help_line, module) in _COMMANDS.items():
        if module not in whole:
            sub.add_parser(command, help=help_line)
        elif command not in sub.choices:  # a module may register several (chat, complete)
            register = _generate_parser if module is None else (
                importlib.import_module(module).register)
            register(sub)
    _no_abbreviations(parser)
    return parser


def _no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """`--max-model 0` must not be taken for --max-model-len (vLLM's parser agrees)."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _no_abbreviations(child)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    try:
        argv = expand_config(argv, parser)
    except ValueError as e:
        print(f"loom: error: {e}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"loom {args.command} {getattr(args, 'bench_command', None) or ''}".rstrip()
              + f": error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before any engine started: nothing to stop
        print(f"loom {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
