"""Constrained decoding: a request's regex, JSON schema or EBNF grammar, compiled by xgrammar (the
grammar library SGLang 0.5.23 uses, sglang/srt/constrained/xgrammar_backend.py) against the
model's tokenizer, and matched token by token while the request decodes.

SGLang's behaviour, kept here: a grammar that does not compile is the request's fault ("Failed to
compile regex grammar: ...", a 400 before any work); `json_schema` "$$ANY$$" is any JSON value;
schema keywords xgrammar 0.2 would silently drop are refused (SGLang's
json_schema_validation.validate_xgrammar_json_schema, ported below); the model's EOS is the
grammar's stop token, so a request ends when its grammar is complete and the model closes it.

xgrammar is imported lazily (a request without a grammar never loads it). Compiling is pure CPU
work whose time grows faster than the grammar's size (a 200 KB alternation regex takes 10 s, a
1.1 MB one most of an hour): the server bounds the size first (`check_size`) and compiles in child
processes it can kill (grammar_pool.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

ANY_JSON = "$$ANY$$"
GRAMMAR_KINDS = ("json_schema", "regex", "ebnf")
# The largest grammar the server compiles: a 64 Ki-character regex of 7,000 alternatives compiles in
# under a second here, and no schema a client derives from a type (a Pydantic model, a function
# signature) comes near 1,024 subschemas. SGLang has no bound; past these, compile time and memory
# grow without one (issue 40: 1.1 MB of regex, 20,000 properties).
MAX_GRAMMAR_CHARS = 64 * 1024
MAX_SCHEMA_NODES = 1024


class GrammarError(ValueError):
    """A grammar the request gave cannot be used; str() is SGLang's message for it."""


def check_size(kind: str, source: str, max_chars: int = MAX_GRAMMAR_CHARS) -> None:
    """Refuse a grammar too large to compile in bounded time (GrammarError naming the field)."""
    if len(source) > max_chars:
        raise GrammarError(f"{kind}: {len(source)} characters; this server compiles grammars of at most "
                           f"{max_chars} characters (--grammar-max-chars: compile time grows faster than a "
                           "grammar's size)")
    if kind != "json_schema" or source == ANY_JSON:
        return
    try:
        schema = json.loads(source)
        for nodes, _ in enumerate(_iter_subschemas(schema), start=1):
            if nodes > MAX_SCHEMA_NODES:
                raise GrammarError(f"json_schema: more than {MAX_SCHEMA_NODES} subschemas (properties, items, "
                                   "definitions...); this server compiles schemas of at most that many")
    except RecursionError:
        raise GrammarError("json_schema: nested too deep to compile") from None
    except GrammarError:
        raise
    except ValueError:
        return  # not JSON: the compile names what is wrong with it


@dataclass
class Grammar:
    """A compiled grammar: `matcher()` gives each request (each of n samples) its own state."""

    kind: str  # one of GRAMMAR_KINDS
    source: str
    compiled: Any  # xgrammar.CompiledGrammar

    def matcher(self) -> Any:
        import xgrammar

        return xgrammar.GrammarMatcher(self.compiled)  # rollback is unbounded in xgrammar 0.2.7


class GrammarCompiler:
    """One per engine: xgrammar's compiler over the tokenizer's vocabulary (its cache makes a
    grammar that comes back, as every request of an eval does, free)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_id: int, *, any_whitespace: bool = True,
                 max_whitespace_cnt: int | None = None, info: Any = None) -> None:
        import xgrammar

        self.info = info if info is not None else tokenizer_info(tokenizer, vocab_size, eos_token_id)
        # one thread: a compile runs beside the engine, and xgrammar's default of 8 would take every core
        self._compiler = xgrammar.GrammarCompiler(self.info, max_threads=1)
        self.vocab_size = vocab_size
        self.any_whitespace = any_whitespace  # SGLang: not --constrained-json-disable-any-whitespace
        self.max_whitespace_cnt = max_whitespace_cnt

    def compile(self, kind: str, source: str) -> Grammar:
        """Raises GrammarError with SGLang's wording (grammar_manager.py)."""
        label = {"json_schema": "json", "regex": "regex", "ebnf": "ebnf"}[kind]
        try:
            if kind == "json_schema":
                if source == ANY_JSON:
                    compiled = self._compiler.compile_builtin_json_grammar()
                else:
                    validate_xgrammar_json_schema(json.loads(source))
                    compiled = self._compiler.compile_json_schema(source, any_whitespace=self.any_whitespace,
                                                                   max_whitespace_cnt=self.max_whitespace_cnt)
            elif kind == "regex":
                compiled = self._compiler.compile_regex(source)
            else:
                compiled = self._compiler.compile_grammar(source)
        except (RuntimeError, ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
            raise GrammarError(f"Failed to compile {label} grammar: {exc}") from None
        return Grammar(kind, source, compiled)


def tokenizer_info(tokenizer: Any, vocab_size: int, eos_token_id: int) -> Any:
    """xgrammar's view of the vocabulary (the model's EOS is the grammar's stop token)."""
    import xgrammar

    return xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=[eos_token_id])


def allocate_bitmask(rows: int, vocab_size: int) -> Any:
    import xgrammar

    return xgrammar.allocate_token_bitmask(rows, vocab_size)


def bitmask_to_allowed(bitmask: Any, vocab_size: int) -> Any:
    """xgrammar's packed int32 bitmask [n, ceil(V/32)] -> bool [n, V] (plain torch: the same on
    any device, no kernel backend to pick)."""
    import torch

    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


# -- SGLang's check of the schema keywords xgrammar would ignore ------------------------------------
# (sglang/srt/constrained/json_schema_validation.py, 0.5.23; tests/embedded/test_grammar.py runs
# both on the same schemas)

_SINGLE_SUBSCHEMA_KEYWORDS = frozenset({
    "additionalItems", "additionalProperties", "contains", "contentSchema", "else", "if", "items", "not",
    "propertyNames", "then", "unevaluatedItems", "unevaluatedProperties",
})
_SUBSCHEMA_ARRAY_KEYWORDS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SUBSCHEMA_MAP_KEYWORDS = frozenset({"$defs", "definitions", "dependentSchemas", "patternProperties", "properties"})
_XGRAMMAR_UNSUPPORTED_KEYWORDS = frozenset({
    "contains", "dependentRequired", "dependentSchemas", "else", "if", "maxContains", "minContains", "multipleOf",
    "not", "then", "uniqueItems",
})
_XGRAMMAR_STRING_FORMATS = frozenset({
    "date", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "json-pointer", "relative-json-pointer",
    "time", "uri", "uri-reference", "uri-template", "uuid",
})


def _escape_json_pointer(value: str) -> str:
    return value.replace("~", "~0").replace("/", "~1")


def _iter_subschemas(schema: Any, pointer: str = "#") -> Iterator[tuple[dict[str, Any], str]]:
    if not isinstance(schema, dict):
        return
    yield schema, pointer
    for keyword in _SINGLE_SUBSCHEMA_KEYWORDS:
        child = schema.get(keyword)
        if isinstance(child, (bool, dict)):
            yield from _iter_subschemas(child, f"{pointer}/{keyword}")
        elif keyword == "items" and isinstance(child, list):
            for index, item in enumerate(child):
                yield from _iter_subschemas(item, f"{pointer}/{keyword}/{index}")
    for keyword in _SUBSCHEMA_ARRAY_KEYWORDS:
        children = schema.get(keyword)
        if isinstance(children, list):
            for index, child in enumerate(children):
                yield from _iter_subschemas(child, f"{pointer}/{keyword}/{index}")
    for keyword in _SUBSCHEMA_MAP_KEYWORDS:
        children = schema.get(keyword)
        if isinstance(children, dict):
            for name, child in children.items():
                yield from _iter_subschemas(child, f"{pointer}/{keyword}/{_escape_json_pointer(name)}")
    dependencies = schema.get("dependencies")
    if isinstance(dependencies, dict):
        for name, child in dependencies.items():
            if isinstance(child, (bool, dict)):
                yield from _iter_subschemas(child, f"{pointer}/dependencies/{_escape_json_pointer(name)}")


def _can_describe_string(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return kind is None or kind == "string" or (isinstance(kind, list) and "string" in kind)


def validate_xgrammar_json_schema(schema: Any) -> None:
    """Refuse constraints xgrammar 0.2 accepts without enforcing them (ValueError naming where)."""
    for sub, pointer in _iter_subschemas(schema):
        unsupported = sorted(_XGRAMMAR_UNSUPPORTED_KEYWORDS.intersection(sub))
        if unsupported:
            raise ValueError(f"JSON Schema at {pointer} is not supported by xgrammar: keyword(s) "
                             f"{', '.join(unsupported)} would be ignored")
        describes_string = _can_describe_string(sub)
        if describes_string and "format" in sub:
            name = sub["format"]
            if not isinstance(name, str) or name not in _XGRAMMAR_STRING_FORMATS:
                raise ValueError(f"JSON Schema at {pointer} is not supported by xgrammar: string format {name!r} "
                                 "is not implemented")
        groups = []
        if describes_string:
            groups = [g for g, present in (("format", "format" in sub), ("pattern", "pattern" in sub),
                                           ("minLength/maxLength", "minLength" in sub or "maxLength" in sub)) if present]
        if len(groups) > 1:
            raise ValueError(f"JSON Schema at {pointer} is not supported by xgrammar: constraints "
                             f"{', '.join(groups)} cannot be enforced together")
