"""A Responses request's input items as the chat messages the template renders, as vLLM
builds them: a message item is a message; a `function_call` joins the assistant turn before
it as a tool call; a `function_call_output` is a `tool` message; a `reasoning` item is the
assistant turn's `reasoning`. Output items are input items too, so a stored response's
output continues a conversation the same way.

Every item is checked here, naming the field (`input.2.content.0.type: ...`): what loom
cannot render (images, files, built-in tools' calls) is refused, never dropped.
"""

from __future__ import annotations

from typing import Any

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text")
Message = dict[str, Any]
"""A chat message as `ChatMessage` takes it."""


def to_messages(items: str | list[Any], where: str = "input") -> list[Message]:
    """The chat messages of a request's `input` (a string: one user message)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[Message] = []
    for i, item in enumerate(items):
        here = f"{where}.{i}"
        if not isinstance(item, dict):
            raise ValueError(f"{here}: must be an object (a message or an item)")
        kind = item.get("type", "message")
        convert = _CONVERTERS.get(kind)
        if convert is None:
            raise ValueError(f"{here}.type: {kind!r} items are not supported by loom (it takes "
                             "message, function_call, function_call_output and reasoning)")
        message = convert(item, here, messages[-1] if messages else None)
        if message is not None:
            messages.append(message)
    return messages


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: must be a string")
    return value


def _content(content: Any, where: str) -> str | list[dict[str, str]]:
    """A message's content: a string, or its text parts (joined as chat joins them)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where}: must be a string or a list of input_text parts")
    parts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise ValueError(f"{where}.{k}.type: {kind!r} content is not supported by loom "
                             "(text only: input_text, output_text)")
        parts.append({"type": "text", "text": _text(part.get("text"), f"{where}.{k}.text")})
    return parts


def _message(item: dict, where: str, previous: Message | None) -> Message | None:
    role = item.get("role")
    if role not in _ROLES:
        raise ValueError(f"{where}.role: must be one of {', '.join(_ROLES)}, got {role!r}")
    content = _content(item.get("content"), f"{where}.content")
    if role == "assistant" and _open_assistant(previous, "content"):
        previous["content"] = content  # the reasoning or calls before it are the same turn
        return None
    return {"role": role, "content": content}


def _function_call(item: dict, where: str, previous: Message | None) -> Message | None:
    call = {"id": _text(item.get("call_id"), f"{where}.call_id"), "type": "function",
            "function": {"name": _text(item.get("name"), f"{where}.name"),
                         "arguments": _text(item.get("arguments"), f"{where}.arguments")}}
    if previous is not None and previous["role"] == "assistant":
        previous.setdefault("tool_calls", []).append(call)
        return None
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _function_call_output(item: dict, where: str, _previous: Message | None) -> Message:
    return {"role": "tool", "tool_call_id": _text(item.get("call_id"), f"{where}.call_id"),
            "content": _content(item.get("output"), f"{where}.output")}


def _reasoning(item: dict, where: str, previous: Message | None) -> Message | None:
    if item.get("encrypted_content"):
        raise ValueError(f"{where}.encrypted_content: not supported by loom (send the "
                         "reasoning's content)")
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list):
        raise ValueError(f"{where}.content: must be a list of reasoning_text parts")
    text = "".join(_text(p.get("text") if isinstance(p, dict) else None,
                         f"{where}.content.{k}.text") for k, p in enumerate(parts))
    if _open_assistant(previous, "reasoning"):
        previous["reasoning"] = text
        return None
    return {"role": "assistant", "content": None, "reasoning": text}


def _open_assistant(previous: Message | None, key: str) -> bool:
    """Whether previous is an assistant turn that does not have `key` yet."""
    return (previous is not None and previous["role"] == "assistant"
            and previous.get(key) is None)


_CONVERTERS = {"message": _message, "function_call": _function_call,
               "function_call_output": _function_call_output, "reasoning": _reasoning}
