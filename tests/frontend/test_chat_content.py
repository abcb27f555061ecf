"""vLLM's --chat-template-content-format: a message's content reaches the chat template as
a string or as OpenAI's list of parts; "auto" reads which the template expects."""

from __future__ import annotations

from loom.entrypoints.openai.protocol_chat import ChatMessage, render_chat
from loom.frontend.chat_content import detect_content_format, resolve_content_format
from loom.frontend.tokenizer import render_chat_template


STRING_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
PARTS_TEMPLATE = ("{% set rest = messages[1:] %}{% for m in rest %}"
                  "{% if m.content is string %}{{ m.content }}{% else %}"
                  "{% for part in m.content | selectattr('type', 'equalto', 'text') %}"
                  "[{{ part.text }}]{% endfor %}{% endif %}{% endfor %}")


def test_auto_reads_whether_the_template_loops_over_content():
    """As vLLM's detection: a loop over a message's content (the message from a loop over
    messages, or over a variable set from them) means parts; else a string."""
    assert detect_content_format(STRING_TEMPLATE) == "string"
    assert detect_content_format(PARTS_TEMPLATE) == "openai"
    assert detect_content_format("{% for x in items %}{% for p in x.content %}{% endfor %}"
                                 "{% endfor %}") == "string"  # not a message
    assert resolve_content_format("auto", None) == "string"
    assert resolve_content_format("string", PARTS_TEMPLATE) == "string"


def test_content_as_a_string_or_as_parts():
    """string: text parts joined by newlines (vLLM's join); openai: a list of text parts,
    a string as one; a tool's result is a string either way."""
    parts = ChatMessage(role="user", content=[{"type": "text", "text": "hel"},
                                              {"type": "text", "text": "lo"}])
    assert parts.for_template("string")["content"] == "hel\nlo"
    assert parts.for_template("openai")["content"] == [{"type": "text", "text": "hel"},
                                                       {"type": "text", "text": "lo"}]
    plain = ChatMessage(role="user", content="hi")
    assert plain.for_template("openai")["content"] == [{"type": "text", "text": "hi"}]
    assert ChatMessage(role="assistant", tool_calls=[]).for_template("openai")["content"] == []
    tool = ChatMessage(role="tool", content=[{"type": "text", "text": "42"}], tool_call_id="c")
    assert tool.for_template("openai")["content"] == "42"


class _TemplateOnly:
    """What render_chat needs of a tokenizer: its template, and rendering."""

    def __init__(self, template: str) -> None:
        self.chat_template = template

    def apply_chat_template(self, messages, add_generation_prompt=True, chat_template=None,
                            **variables) -> str:
        return render_chat_template(chat_template or self.chat_template, messages=messages,
                                    add_generation_prompt=add_generation_prompt, **variables)


def test_render_chat_hands_each_template_what_it_reads():
    """auto: the parts to a template that loops over them (a string one would print the
    list), a string to one that does not; a final message continued is cut after its text
    either way."""
    system = ChatMessage(role="system", content="sys")
    user = ChatMessage(role="user", content=[{"type": "text", "text": "a"},
                                             {"type": "text", "text": "b"}])
    assert render_chat(_TemplateOnly(PARTS_TEMPLATE), [system, user]) == "[a][b]"
    assert render_chat(_TemplateOnly(PARTS_TEMPLATE), [system, user],
                       content_format="string") == "a\nb"
    assert render_chat(_TemplateOnly(STRING_TEMPLATE), [user]) == "<user>a\nb"
    continued = render_chat(_TemplateOnly(STRING_TEMPLATE + "<end>"),
                            [ChatMessage(role="assistant", content="Once")],
                            add_generation_prompt=False, continue_final_message=True)
    assert continued == "<assistant>Once"
