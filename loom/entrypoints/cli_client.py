"""`loom chat` and `loom complete`: vLLM's command-line clients of a running server (any
OpenAI-compatible one), through the official openai client.

    loom chat [--url URL] [--model-name NAME] [--api-key KEY] [--system-prompt TEXT] [-q MSG]
    loom complete [--url URL] [--model-name NAME] [--api-key KEY] [--max-tokens N] [-q PROMPT]

Without -q/--quick each reads lines at a `> ` prompt until end of input (Ctrl-D) or Ctrl-C,
and streams each reply as it comes; chat keeps the whole conversation. The model is
--model-name, else the server's first (GET /v1/models).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from urllib.parse import urlsplit

DEFAULT_URL = "http://localhost:8000/v1"


def register(subparsers) -> None:
    chat = subparsers.add_parser("chat", help="chat with a running server's model",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(chat)
    chat.add_argument("--system-prompt", default=None,
                      help="a system message that starts the conversation")
    chat.add_argument("-q", "--quick", default=None, metavar="MESSAGE",
                      help="send this one message, print the reply and exit")
    chat.set_defaults(func=run_chat)
    complete = subparsers.add_parser("complete", help="complete prompts on a running server",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(complete)
    complete.add_argument("--max-tokens", type=int, default=None,
                          help="the most tokens a completion may have (the server's default)")
    complete.add_argument("-q", "--quick", default=None, metavar="PROMPT",
                          help="complete this one prompt, print it and exit")
    complete.set_defaults(func=run_complete)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=DEFAULT_URL,
                   help=f"the server's OpenAI API base URL (default {DEFAULT_URL})")
    p.add_argument("--model-name", default=None,
                   help="the model to ask (default: the first the server lists)")
    p.add_argument("--api-key", default=None,
                   help="the server's API key (default: $OPENAI_API_KEY, else none)")


def run_chat(args: argparse.Namespace) -> int:
    client, model = _connect(args)
    messages = [] if args.system_prompt is None else [
        {"role": "system", "content": args.system_prompt}]

    def reply(text: str) -> None:
        messages.append({"role": "user", "content": text})
        stream = client.chat.completions.create(model=model, messages=messages, stream=True)
        answer = _print_stream(c.choices[0].delta.content for c in stream if c.choices)
        messages.append({"role": "assistant", "content": answer})
    return _session(args, reply)


def run_complete(args: argparse.Namespace) -> int:
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ValueError(f"max_tokens: must be positive, got {args.max_tokens}")
    client, model = _connect(args)
    extra = {} if args.max_tokens is None else {"max_tokens": args.max_tokens}

    def reply(prompt: str) -> None:
        stream = client.completions.create(model=model, prompt=prompt, stream=True, **extra)
        _print_stream(c.choices[0].text for c in stream if c.choices)
    return _session(args, reply)


def _connect(args: argparse.Namespace):
    """The client, and the model to ask; an unreachable server is a one-line error."""
    check_http_url(args.url)
    for name in ("httpx", "openai"):  # each request and retry logged at INFO: not for a client
        logging.getLogger(name).setLevel(logging.WARNING)
    import openai
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
    client = openai.OpenAI(base_url=args.url, api_key=api_key)
    if args.model_name is not None:
        return client, args.model_name
    try:
        models = client.models.list().data
    except openai.OpenAIError as e:
        raise ValueError(_failure(e, args.url, None)) from None
    if not models:
        raise ValueError(f"model_name: the server at {args.url} lists no model; pass one")
    return client, models[0].id


def check_http_url(url: str, field: str = "url", example: str = DEFAULT_URL) -> None:
    """An http(s) URL with a host (and a numeric port, if any), before any request."""
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # raises ValueError where the port is not a number
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{field}: must be an http(s) URL such as {example}, got {url!r}")


def _session(args: argparse.Namespace, reply) -> int:
    """One message (-q: a failure is the command's error), or a `> ` prompt until end of
    input (a failed request is one line, and the session goes on)."""
    import openai
    lines = [args.quick] if args.quick is not None else _prompts()
    for text in lines:
        try:
            reply(text)
        except openai.OpenAIError as e:
            message = _failure(e, args.url, args.model_name)
            if args.quick is not None:
                raise ValueError(message) from None
            print(f"error: {message}", file=sys.stderr)
    return 0


def _failure(e: Exception, url: str, model: str | None) -> str:
    """One line for a failed request, naming the flag most likely at fault."""
    import openai
    reason = _reason(e)
    if isinstance(e, openai.APIConnectionError):  # timeouts included
        return f"url: cannot reach {url}: {reason}"
    status = getattr(e, "status_code", None)
    if status in (401, 403):
        return f"api_key: the server at {url} refused it (HTTP {status}): {reason}"
    if status == 404 and model is not None and model in reason:
        return f"model_name: the server at {url} does not serve it ({reason}), got {model!r}"
    if status == 404:
        return f"url: {url} answered HTTP 404 (is it the API's base, e.g. .../v1?): {reason}"
    return f"server: {url} answered" + (f" HTTP {status}" if status else "") + f": {reason}"


def _prompts():
    while True:
        try:
            yield input("> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return


def _print_stream(pieces) -> str:
    text = []
    for piece in pieces:
        if piece:
            print(piece, end="", flush=True)
            text.append(piece)
    print()
    return "".join(text)


def _reason(e: Exception) -> str:
    """The server's own message where it sent one (OpenAI's error body)."""
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        body = body.get("error", body)
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])
    return str(e) or type(e).__name__
