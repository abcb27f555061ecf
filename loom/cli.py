"""`loom generate | serve | run-batch | chat | complete | bench ...`: vLLM's commands."""

from __future__ import annotations

import argparse
import logging
import sys

from loom.cli_config import expand_config


def _generate_parser(sub) -> None:
    from loom.engine.arg_utils import EngineArgs
    p = sub.add_parser("generate", help="generate text offline for one or more prompts")
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
    first (`engine/json_flags.py`)."""

    def parse_known_args(self, args=None, namespace=None):
        from loom.engine.json_flags import fold_compilation_flags
        try:
            args = fold_compilation_flags(sys.argv[1:] if args is None else list(args))
        except ValueError as e:
            self.error(str(e))
        return super().parse_known_args(args, namespace)


def build_parser() -> argparse.ArgumentParser:
    from loom import __version__
    parser = _Parser(prog="loom", description=__doc__)
    parser.add_argument("-v", "--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True,
                                parser_class=argparse.ArgumentParser)
    _generate_parser(sub)
    for register in _optional_commands():
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


def _optional_commands():
    """Subcommands that live beside their code (serve, run-batch, chat, complete, bench)."""
    from loom.bench.cli import register as bench
    from loom.entrypoints.cli_client import register as clients
    from loom.entrypoints.openai.cli import register as serve
    from loom.entrypoints.openai.run_batch import register as run_batch
    return [serve, run_batch, clients, bench]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    parser = build_parser()
    try:
        argv = expand_config(list(sys.argv[1:] if argv is None else argv), parser)
    except ValueError as e:
        print(f"loom: error: {e}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"loom {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before any engine started: nothing to stop
        print(f"loom {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
