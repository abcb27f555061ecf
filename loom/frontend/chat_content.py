"""How a chat message's content reaches the chat template: vLLM's
--chat-template-content-format.

- "string": the content is one string; a list of text parts is joined by newlines.
- "openai": the content is a list of parts, `[{"type": "text", "text": ...}]`; a string is
  one part, no content none. Tool results stay strings (most templates print them whole).
- "auto": "openai" when the template loops over a message's content (Llama 4's, Gemma 3's
  and Mistral's newer templates do), else "string" (Llama 3's, Qwen's, SmolLM2's): the
  same reading of the template's syntax tree as vLLM's.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator

import jinja2
from jinja2 import nodes

from loom.frontend.tokenizer import parse_chat_template

logger = logging.getLogger(__name__)

CONTENT_FORMATS = ("auto", "string", "openai")


def resolve_content_format(content_format: str, template: str | None) -> str:
    """"string" or "openai": content_format itself, or for "auto" what `template` reads."""
    if content_format not in CONTENT_FORMATS:
        raise ValueError(f"chat_template_content_format: {content_format!r} is not one of "
                         f"{CONTENT_FORMATS}")
    if content_format != "auto":
        return content_format
    return "string" if template is None else detect_content_format(template)


def template_content(texts: list[str], content_format: str) -> str | list[dict[str, str]]:
    """A message's text parts as the template takes them under content_format."""
    if content_format == "openai":
        return [{"type": "text", "text": t} for t in texts]
    return "\n".join(texts)


@functools.lru_cache(maxsize=32)
def detect_content_format(template: str) -> str:
    try:
        root = parse_chat_template(template)
    except jinja2.TemplateSyntaxError:
        return "string"  # rendering it will say what is wrong
    messages = set(_aliases(root, "messages"))
    items = {loop.target.name for loop in _loops(root)
             if any(_reads(loop.iter, name) for name in messages)}
    found = any(_reads(loop.iter, item, "content") for loop in _loops(root) for item in items)
    detected = "openai" if found else "string"
    logger.info("the chat template takes message content as %s (auto-detected; "
                "--chat-template-content-format sets it)", detected)
    return detected


def _loops(root: nodes.Node) -> Iterator[nodes.For]:
    """Loops with one loop variable (`for a, b in ...` binds no message)."""
    return (loop for loop in root.find_all(nodes.For) if isinstance(loop.target, nodes.Name))


def _aliases(root: nodes.Node, name: str) -> Iterator[str]:
    """name, and every variable set from it or from one of those (`{% set loop_messages =
    messages[1:] %}`), transitively."""
    seen, pending = {name}, [name]
    yield name
    while pending:
        source = pending.pop()
        for assign in root.find_all(nodes.Assign):
            target = assign.target
            if isinstance(target, nodes.Name) and target.name not in seen \
                    and _reads(assign.node, source):
                seen.add(target.name)
                pending.append(target.name)
                yield target.name


def _reads(node: nodes.Node, name: str, key: str | None = None) -> bool:
    """Whether node is `name` (key None) or `name[key]` / `name.key`, under any filters,
    tests and slices."""
    while isinstance(node, nodes.Filter | nodes.Test) or (
            isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice)):
        if node.node is None:
            return False
        node = node.node
    if key is not None:
        if isinstance(node, nodes.Getitem):
            if not (isinstance(node.arg, nodes.Const) and node.arg.value == key):
                return False
        elif not (isinstance(node, nodes.Getattr) and node.attr == key):
            return False
        node = node.node
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name
