"""Structured output (guided decoding) with llguidance, on the host.

The frontend compiles each request's constraint once to reject bad ones with a ValueError.
The engine core gives every guided request its own `GrammarMatcher`; the scheduler advances
it with each accepted token, finishes the request when the grammar is complete, and sends
the allowed-token bitmask of every request about to sample to the workers, whose sampler
masks the other tokens to -inf. No torch here: the API server imports this module.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import llguidance

from loom.frontend.tokenizer import load_tokenizer
from loom.sampling_params import GuidedDecodingParams, SamplingParams

if TYPE_CHECKING:
    from loom.core.request import Request

logger = logging.getLogger(__name__)

_ANY_JSON_OBJECT = '{"type": "object"}'
# Compact JSON unless a schema's own "x-guidance" says otherwise: with free whitespace a
# model can emit whitespace until max_tokens, never closing the object.
_JSON_DEFAULTS = {"whitespace_flexible": False}


def grammar_of(guided: GuidedDecodingParams) -> str:
    """The llguidance grammar of the one constraint set; ValueError if it cannot be built."""
    kind = guided.kinds[0]
    try:
        if kind in ("json", "json_object"):
            schema = _ANY_JSON_OBJECT if kind == "json_object" else _schema_text(guided.json)
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_DEFAULTS)
        if kind == "choice":
            return llguidance.grammar_from("choice", guided.choice)
        if kind == "regex":
            return llguidance.grammar_from("regex", guided.regex)
        return llguidance.grammar_from("grammar", guided.grammar)
    except (ValueError, TypeError) as e:
        raise ValueError(f"guided_decoding.{kind}: {e}") from None


def _schema_text(schema: str | dict) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"not valid JSON: {e}") from None
    return json.dumps(closed_objects(schema))


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
"""Keywords whose values map names to subschemas: closed_objects recurses into these..."""
_SCHEMA_ITEMS = ("items", "prefixItems", "additionalProperties", "anyOf", "oneOf")
"""...and into these (a subschema or a list of them). Not into `not`, `if` / `then` /
`else` or `dependentSchemas`, whose objects are negated or merged with their parent's."""
_OPENING = ("additionalProperties", "unevaluatedProperties", "$ref", "anyOf", "oneOf", "if",
            "dependentSchemas")
"""Beside `properties`, any of these keeps the object as the schema says: it either decides
other properties itself or merges in properties declared elsewhere."""


def closed_objects(schema):
    """The schema with every object that lists its `properties`, and says nothing of other
    properties, closed to them (`additionalProperties: false`): what vLLM's default backend
    (xgrammar's strict mode) generates. JSON Schema's own default admits any other key, and
    a model given that freedom (a small one especially) wanders into keys of its own and
    may never close the object. A schema that composes objects (`allOf` anywhere, or a
    `$ref` beside `properties`) is returned unchanged: closing one part would refuse the
    properties another part adds. Members of `anyOf` / `oneOf` are closed unless their
    parent lists properties of its own."""
    if _composes(schema):
        return schema
    return _close(schema, True)


def _composes(node) -> bool:
    if isinstance(node, list):
        return any(_composes(n) for n in node)
    if not isinstance(node, dict):
        return False
    if "allOf" in node or ("$ref" in node and "properties" in node):
        return True
    return any(_composes(v) for v in node.values())


def _close(node, close: bool):
    if isinstance(node, list):
        return [_close(n, close) for n in node]
    if not isinstance(node, dict):
        return node
    out = dict(node)
    own = isinstance(out.get("properties"), dict)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _close(sub, True) for name, sub in out[key].items()}
    for key in _SCHEMA_ITEMS:
        if key in node:  # the parent's own properties merge with its alternatives'
            out[key] = _close(out[key], not own if key in ("anyOf", "oneOf") else True)
    if close and own and not any(k in node for k in _OPENING):
        out["additionalProperties"] = False
    return out


def validate_guided(guided: GuidedDecodingParams) -> str:
    """Compile the constraint (without a tokenizer) and return its grammar, or raise."""
    grammar = grammar_of(guided)
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise ValueError(f"guided_decoding.{guided.kinds[0]}: {error.strip()}")
    return grammar


class GrammarMatcher:
    """One request's position in its grammar."""

    def __init__(self, matcher: llguidance.LLMatcher, request_id: str,
                 first_bitmask: bytes | None = None) -> None:
        self._matcher = matcher
        self._request_id = request_id
        self._next_bitmask = first_bitmask
        """Computed before any token was accepted (to check the grammar); used once."""
        self.error: str | None = None
        """Why the grammar failed mid-generation (the request then ends with this error)."""

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; True when generation must end here (`error` says
        why, if the grammar failed)."""
        self._next_bitmask = None
        if self._matcher.consume_token(token_id) and not self._matcher.is_error():
            return self._matcher.is_stopped()
        # Either the grammar failed while computing the mask (llguidance's limits, e.g. a
        # regex that grows too many states), or llguidance allowed a token it then refused.
        # The output no longer follows the constraint: the request ends with an error.
        reason = self._matcher.get_error() or "the grammar refused a token its mask allowed"
        self.error = f"guided_decoding: generation failed at token {token_id}: {reason}"
        logger.warning("request %s: %s", self._request_id, self.error)
        return True

    def bitmask(self) -> bytes:
        """Allowed next tokens: bit i of 32-bit word j is token 32 * j + i."""
        if self._next_bitmask is not None:
            return self._next_bitmask
        return self._matcher.compute_bitmask()


class StructuredOutputManager:
    """Builds matchers. The tokenizer is loaded, and llguidance's made from it (about 1 s for
    a 128k vocabulary), at the first guided request, so unguided serving never pays for it."""

    def __init__(self, tokenizer_path: str | None, generation_config: str | None = None) -> None:
        self._tokenizer_path = tokenizer_path
        self._generation_config = generation_config
        """--generation-config PATH: its EOS ids end a grammar, as they end generation."""
        self._ll_tokenizer: llguidance.LLTokenizer | None = None

    def _get_ll_tokenizer(self) -> llguidance.LLTokenizer:
        if self._ll_tokenizer is None:
            tok = load_tokenizer(self._tokenizer_path,
                                 generation_config=self._generation_config)
            self._ll_tokenizer = llguidance.LLTokenizer(
                tok.to_json_str(), eos_token=sorted(tok.eos_token_ids) or None)
        return self._ll_tokenizer

    def matcher_for(self, request_id: str, params: SamplingParams) -> GrammarMatcher | None:
        """A fresh matcher for a guided request (None for an unguided one); ValueError if its
        constraint does not compile."""
        if params.guided_decoding is None:
            return None
        if self._tokenizer_path is None:
            raise ValueError("guided_decoding: the engine has no tokenizer to compile it with")
        grammar = validate_guided(params.guided_decoding)
        matcher = llguidance.LLMatcher(self._get_ll_tokenizer(), grammar, log_level=0)
        # Some grammars compile but fail, or allow nothing, only once a mask is computed:
        # compute the first one here, so that they are refused rather than generated from.
        first = matcher.compute_bitmask() if not matcher.is_error() else None
        kind = params.guided_decoding.kinds[0]
        if matcher.is_error():
            raise ValueError(f"guided_decoding.{kind}: {matcher.get_error()}")
        if not any(first):
            raise ValueError(f"guided_decoding.{kind}: the constraint allows no token "
                             "(it matches no text)")
        return GrammarMatcher(matcher, request_id, first)


def grammar_bitmasks(requests: Iterable[Request]) -> dict[str, bytes]:
    """Bitmasks of the guided requests that sample this step (their schedule reaches the
    last known token; a prefill chunk short of it samples nothing)."""
    return {r.request_id: r.grammar.bitmask() for r in requests
            if r.grammar is not None and r.num_computed_tokens >= r.num_tokens}
