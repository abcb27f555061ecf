"""How the offline `LLM`'s methods read their prompt and params arguments, as vLLM's take
them: one prompt or a list, text or token ids or vLLM's prompt dicts; params one for all or
one per prompt."""

from __future__ import annotations


def per_prompt(params, count: int, kind: type, field: str) -> list:
    """`params` for each of `count` prompts: None (kind's defaults), one for all, or a
    sequence of one per prompt."""
    if params is None:
        return [kind()] * count
    if isinstance(params, kind):
        return [params] * count
    if not isinstance(params, list | tuple):
        raise ValueError(f"{field}: expected {kind.__name__} or a list of them, got "
                         f"{type(params).__name__}")
    if len(params) != count:
        raise ValueError(f"{field}: {len(params)} given for {count} prompts")
    wrong = [type(p).__name__ for p in params if not isinstance(p, kind)]
    if wrong:
        raise ValueError(f"{field}: expected {kind.__name__} for every prompt, got {wrong[0]}")
    return list(params)


def as_list(prompts) -> list | tuple:
    if isinstance(prompts, str | dict) or (isinstance(prompts, list) and prompts
                                          and isinstance(prompts[0], int)):
        return [prompts]
    if not isinstance(prompts, list | tuple):
        raise ValueError(f"prompts: expected a string, a list of token ids, or a list of "
                         f"them; got {type(prompts).__name__}")
    return prompts


_PROMPT_KEYS = {"prompt", "prompt_token_ids", "cache_salt"}


def prompt_list(prompts) -> list:
    """A list of prompts, each a string or a list of token ids. Also takes one prompt alone,
    and vLLM's prompt dicts ({"prompt": text} or {"prompt_token_ids": ids}, with an
    optional "cache_salt")."""
    out = []
    for p in as_list(prompts):
        if isinstance(p, dict):
            keys = set(p) & {"prompt", "prompt_token_ids"}
            if len(keys) != 1:
                raise ValueError('prompts: a prompt dict needs exactly one of "prompt" and '
                                 f'"prompt_token_ids"; got keys {sorted(p)}')
            other = sorted(set(p) - _PROMPT_KEYS, key=str)
            if other:  # vLLM's multi_modal_data and the like: never dropped unread
                raise ValueError(f"prompts: a prompt dict takes {', '.join(sorted(_PROMPT_KEYS))}"
                                 f" (loom's models read text only); got {other}")
            p = p[keys.pop()]
        out.append(p)
    return out


def score_texts(data, field: str) -> list:
    """One side of a score call as a list of prompts (text or token ids)."""
    if not isinstance(data, str | dict | list | tuple):
        raise ValueError(f"{field}: expected a string, a list of token ids, or a list of "
                         f"them; got {type(data).__name__}")
    return prompt_list(data)
