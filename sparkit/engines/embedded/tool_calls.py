"""Tool calls: the model's text read into the API's `tool_calls` as SGLang 0.5.23 reads it, and the
grammar that makes a required or named call the only thing the model can write.

SGLang reads a model's tool calls with the parser `--tool-call-parser` names. Ling 3.0's is `ling3`
(SGLang picks it itself for the Bailing hybrid and V3 architectures: parser/template_detection.py),
its Ling3Detector: GLM-4.5's XML,

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

each value typed by the tool's JSON schema (a string as written, anything else as JSON). This module
is a port of that detector (sglang/srt/function_call/ling3_detector.py and glm4_moe_detector.py, the
argument typing of utils.py), non-streamed and streamed, so that the embedded engine answers what
SGLang answers on the same text; tests/embedded_server/test_tool_calls.py runs SGLang's own
FunctionCallParser on the same texts and chunks. tiny-ling's chat template writes a call in this
format, so a conversation's earlier calls read back as they were made.

For `tool_choice` "required" or a named function SGLang's ling3 parser has no structural tag:
SGLang constrains the output with a JSON schema instead, an array of `{"name", "parameters"}`
objects (function_call/utils.get_json_schema_constraint, `required_schema` here), and reads the
array back as JSON (serving_chat._process_tool_calls). Under that grammar even a model never
trained for tools writes a valid call.

Pure Python: no torch, no HTTP; the routes bind it to the chat and Ollama handlers.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
import warnings
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

# SGLang's --tool-call-parser names this engine reads (the format tiny-ling's chat template writes).
TOOL_CALL_PARSERS = ("ling3",)


@dataclass(frozen=True)
class ToolDef:
    """A tool of the request as the parser sees it: its function's name and parameters schema."""

    name: str
    parameters: Any = None


@dataclass
class ToolCallItem:
    """One parsed call (SGLang's ToolCallItem): `parameters` is JSON text; streamed, a piece of it."""

    tool_index: int
    name: str | None
    parameters: str


def new_call_id() -> str:
    """SGLang's id for a call it parsed (every parser but Kimi's)."""
    return f"call_{uuid.uuid4().hex[:24]}"


# -- a tool's argument types (function_call/utils.py, glm4_moe_detector.py) -------------------------


def schema_properties(schema: Any) -> dict[str, Any]:
    """A parameters schema's top-level properties, through anyOf/oneOf/allOf when it has none."""
    if not isinstance(schema, dict):
        return {}
    properties = schema.get("properties")
    if isinstance(properties, dict):
        return properties
    merged: dict[str, Any] = {}
    for keyword in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(keyword)
        if isinstance(branches, list):
            for branch in branches:
                for key, value in schema_properties(branch).items():
                    merged.setdefault(key, value)
    return merged


_ENUM_TYPES = ((type(None), "null"), (bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
               (list, "array"), (dict, "object"))


def _enum_type(values: list) -> str:
    kinds = {next(name for kind, name in _ENUM_TYPES if isinstance(v, kind)) for v in values
             if any(isinstance(v, kind) for kind, _ in _ENUM_TYPES)}
    return kinds.pop() if len(kinds) == 1 else "string"


def _union_type(schemas: Any) -> str | None:
    types = [t for t in (infer_type(s) for s in schemas) if t] if isinstance(schemas, list) else []
    if not types:
        return None
    if len(set(types)) == 1:
        return types[0]
    if len(set(types)) == 2 and "null" in types:
        return next(t for t in types if t != "null")
    return "string" if "string" in types else types[0]


def infer_type(schema: Any) -> str | None:
    """The primary type of a parameter's schema (SGLang's infer_type_from_json_schema, in its order)."""
    if not isinstance(schema, dict):
        return None
    if "type" in schema:
        kind = schema["type"]
        if isinstance(kind, str):
            return kind
        if isinstance(kind, list) and kind:
            return next((t for t in kind if t != "null"), "string")
    if "anyOf" in schema or "oneOf" in schema:
        found = _union_type(schema.get("anyOf") or schema.get("oneOf"))
        if found:
            return found
    if "enum" in schema and isinstance(schema["enum"], list):
        return _enum_type(schema["enum"]) if schema["enum"] else "string"
    if "allOf" in schema and isinstance(schema["allOf"], list):
        return next((t for t in (infer_type(s) for s in schema["allOf"]) if t and t != "string"), "string")
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return None


def argument_type(func_name: str, key: str, tools: list[ToolDef]) -> str | None:
    tool = {t.name: t for t in tools}.get(func_name)
    if tool is None:
        return None
    properties = schema_properties(tool.parameters)
    return infer_type(properties[key]) if key in properties else None


def _to_number(value: str) -> Any:
    try:
        return float(value) if "." in value or "e" in value.lower() else int(value)
    except (ValueError, AttributeError):
        return value


def _literal(value: str) -> Any:
    with warnings.catch_warnings():  # SGLang's safe_literal_eval: a bad escape must not warn
        warnings.simplefilter("ignore")
        return ast.literal_eval(value)


def parse_argument(raw: str, kind: str | None) -> tuple[Any, bool]:
    """An <arg_value>'s text as a value: JSON, JSON inside a string, the raw text for a string
    parameter, a Python literal, else the text (SGLang's parse_arguments, strategy by strategy)."""
    try:
        value = json.loads(raw)
        return (_to_number(value) if kind == "number" and isinstance(value, str) else value), True
    except ValueError:
        pass
    try:
        value = json.loads(json.loads('{"tmp": "' + raw + '"}')["tmp"])
        return (_to_number(value) if kind == "number" and isinstance(value, str) else value), True
    except (ValueError, KeyError):
        pass
    if kind == "string":
        if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
            return raw[1:-1], True
        return raw, True
    try:
        return _literal(raw), True
    except (ValueError, SyntaxError):
        pass
    return raw, True  # SGLang: json.loads(json.dumps(str(raw))), the text itself


def parse_argument_pairs(pairs: list[tuple[str, str]], func_name: str, tools: list[ToolDef]) -> dict[str, Any]:
    """<arg_key>/<arg_value> pairs as the call's arguments, each typed by the tool's schema."""
    arguments: dict[str, Any] = {}
    for key, raw in pairs:
        key = key.strip()
        kind = argument_type(func_name, key, tools)
        value, good = parse_argument(raw, kind)
        if kind == "string":
            if isinstance(value, str):
                arguments[key] = value
            elif isinstance(value, (dict, list)):
                arguments[key] = json.dumps(value, ensure_ascii=False)
            else:
                arguments[key] = str(value)
        else:
            arguments[key] = value if good else raw
    return arguments


def calls_of(actions: list[dict[str, Any]], tools: list[ToolDef]) -> list[ToolCallItem]:
    """Calls of the request's tools (SGLang's parse_base_json: a call of an undefined function is
    dropped, as SGLANG_FORWARD_UNKNOWN_TOOLS is off by default)."""
    indices = {t.name: i for i, t in enumerate(tools) if t.name}
    return [ToolCallItem(indices[a["name"]], a["name"],
                         json.dumps(a.get("parameters") or a.get("arguments", {}), ensure_ascii=False))
            for a in actions if a.get("name") and a.get("name") in indices]


# -- ling3: the XML format, read whole ----------------------------------------------------------------

BOT, EOT = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)
_DETAIL = re.compile(r"<tool_call>\s*(.*?)(?:(?:\\n|\n)\s*|(?=<arg_key>)|(?=</tool_call>))(<arg_key>.*?)?</tool_call>",
                     re.DOTALL)
_ARG = re.compile(r"<arg_key>(.*?)</arg_key>(?:\\n|\s)*<arg_value>(.*?)</arg_value>", re.DOTALL)
_PARTIAL = re.compile(r"<tool_call>\s*(.*?)(?:(?:\\n|\n)\s*|(?=<arg_key>)|(?=</tool_call>))(.*?)(</tool_call>|$)",
                      re.DOTALL)
_CALL_END = re.compile(r"</tool_call>|$")


def ling3_parse(text: str, tools: list[ToolDef]) -> tuple[str, list[ToolCallItem]]:
    """The whole reply: (the text before the first call, stripped; the calls), or (text, []) when
    it holds no call (SGLang's FunctionCallParser.parse_non_stream with Ling3Detector)."""
    if not tools or BOT not in text:
        return text, []
    normal = text[:text.find(BOT)].strip()
    calls: list[ToolCallItem] = []
    try:
        for block in _CALL.findall(text):
            detail = _DETAIL.search(block)
            if detail is None:
                continue
            name = detail.group(1) or ""
            arguments = parse_argument_pairs(_ARG.findall(detail.group(2) or ""), name, tools)
            calls += calls_of([{"name": name, "parameters": arguments}], tools)
    except Exception:  # noqa: BLE001 - SGLang's detector gives the whole text back on any error
        return text, []
    return normal, calls


# -- ling3, streamed: XML arguments turned into JSON as they arrive -------------------------------------


class _State(str, Enum):
    INIT = "INIT"
    BETWEEN = "BETWEEN"
    IN_KEY = "IN_KEY"
    WAITING_VALUE = "WAITING_VALUE"
    IN_VALUE = "IN_VALUE"


@dataclass
class _ArgumentStream:
    """One call's arguments as a character state machine: XML in, JSON increments out (SGLang's
    _process_xml_to_json_streaming)."""

    func_name: str
    tools: list[ToolDef]
    state: _State = _State.INIT
    key: str = ""
    value: str = ""
    tag: str = ""
    first: bool = True
    started: bool = False
    kind: str | None = None

    def feed(self, raw: str) -> str:
        out = []
        for char in raw:
            self.tag += char
            out.append(self._step())
        return "".join(out)

    def _step(self) -> str:
        tag = self.tag
        if self.state in (_State.INIT, _State.BETWEEN):
            if tag.endswith("<arg_key>"):
                self.state, self.key, self.tag = _State.IN_KEY, "", ""
                opened = "{" if self.first else ", "
                self.first = False
                return opened
        elif self.state == _State.IN_KEY:
            if tag.endswith("</arg_key>"):
                self.key, self.tag, self.state = tag[:-10].strip(), "", _State.WAITING_VALUE
                return json.dumps(self.key, ensure_ascii=False) + ": "
        elif self.state == _State.WAITING_VALUE:
            if tag.endswith("<arg_value>"):
                self.state, self.value, self.tag, self.started = _State.IN_VALUE, "", "", False
                self.kind = self._value_type()
        elif self.state == _State.IN_VALUE:
            return self._in_value()
        return ""

    def _value_type(self) -> str:
        """The parameter's schema type, else a guess from the value so far (SGLang's _get_value_type)."""
        declared = argument_type(self.func_name, self.key, self.tools)
        if declared:
            return declared
        content = self.value.strip() if self.value else ""
        if not content:
            return "string"
        try:
            parsed = json.loads(content)
        except ValueError:
            first = content[0]
            return "number" if first.isdigit() or first in "-." else "object" if first in "{[" else "string"
        if isinstance(parsed, dict):
            return "object"
        if isinstance(parsed, list):
            return "array"
        if isinstance(parsed, bool):
            return "boolean"
        if isinstance(parsed, (int, float)):
            return "number"
        if isinstance(parsed, str) and (parsed.isdigit() or (parsed.startswith("-") and parsed[1:].isdigit())):
            return "number"
        return "string"

    def _in_value(self) -> str:
        tag, kind = self.tag, self.kind or "string"
        closing = "</arg_value>"
        if tag.endswith(closing):
            final = tag[:-len(closing)]
            self.value += final
            if self.started:
                out = (json.dumps(final, ensure_ascii=False)[1:-1] if kind == "string" else final) if final else ""
                out += '"' if kind == "string" else ""
            else:
                out = _complete_value(self.value, kind)
            self.tag, self.state, self.value, self.started, self.kind = "", _State.BETWEEN, "", False, None
            return out
        if len(tag) <= len(closing) and closing.startswith(tag):
            return ""  # may be the closing tag: wait
        out = ""
        if kind == "string" and not self.started:
            out, self.started = '"', True
        if tag:
            self.started = True
            out += json.dumps(tag, ensure_ascii=False)[1:-1] if kind == "string" else tag
            self.value += tag
            self.tag = ""
        return out


def _complete_value(value: str, kind: str) -> str:
    """A value that arrived whole, as JSON (SGLang's _format_value_complete)."""
    if kind == "string":
        return json.dumps(value, ensure_ascii=False)
    if kind == "number":
        return str(_to_number(value.strip()))  # not a number: the text as it is, as SGLang's
    return value


@dataclass
class Ling3Stream:
    """A streamed reply read as SGLang's Ling3Detector reads it chunk by chunk: text outside calls
    goes out as content, a call's name as soon as it is known, its arguments as JSON pieces."""

    tools: list[ToolDef]
    buffer: str = ""
    tool_id: int = -1
    name_sent: bool = False
    streamed_raw: int = 0
    prev_calls: list[dict[str, Any]] = field(default_factory=list)
    streamed_args: list[str] = field(default_factory=list)
    _open: tuple[str, int] | None = None
    _end_scan: int = 0
    _args: _ArgumentStream | None = None

    def feed(self, new_text: str) -> tuple[str, list[ToolCallItem]]:
        """One chunk in: (content to send, call pieces to send) (SGLang's parse_stream_chunk)."""
        if not self.tools:
            return new_text, []
        self.buffer += new_text
        text = self.buffer
        if BOT not in text:
            if any(BOT.startswith(text[-i:]) for i in range(1, min(len(text), len(BOT)) + 1)):
                return "", []  # may be the start of a call: hold it back
            self.buffer = ""
            return text.replace(EOT, ""), []
        try:
            return "", self._calls(text)
        except Exception:  # noqa: BLE001 - SGLang's parser sends the buffer as text on any error
            return text, []

    def end(self) -> tuple[str, list[ToolCallItem]]:
        """The stream ended (SGLang's parse_stream_end: the ling3 detector keeps nothing back)."""
        return "", []

    def unstreamed(self) -> ToolCallItem | None:
        """What the last call's streamed arguments lack of its parsed ones, sent when the stream
        ends (SGLang's _check_for_unstreamed_tool_args)."""
        if not self.prev_calls or not self.streamed_args:
            return None
        index = len(self.prev_calls) - 1
        if index >= len(self.streamed_args):
            return None
        expected = self.prev_calls[index].get("arguments", {})
        expected = expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)
        actual = self.streamed_args[index]
        rest = expected[len(actual):] if expected.startswith(actual) else ""
        return ToolCallItem(index, None, rest) if rest else None

    def _match(self, text: str) -> tuple[str, str, str, int] | None:
        """The open call: (name, its arguments so far, the closing tag or "", where it ends),
        scanning only the new tail for the closing tag (SGLang's _match_tool_call)."""
        if self._open is None:
            match = _PARTIAL.search(text)
            if match is None:
                return None
            self._open = match.group(1), match.start(2)
            self._end_scan = match.start(2)
        name, args_start = self._open
        end = _CALL_END.search(text, self._end_scan)
        if end.group():
            self._open = None
        else:
            self._end_scan = max(args_start, len(text) - len(EOT) + 1)
        return name, text[args_start:end.start()], end.group(), end.end()

    def _calls(self, text: str) -> list[ToolCallItem]:
        match = self._match(text)
        if not match:
            return []
        name_raw, args_raw, closed, match_end = match
        if name_raw is None or not name_raw.strip():
            return []
        name, args_raw = name_raw.strip(), (args_raw.strip() if args_raw else "")
        if self.tool_id == -1:
            self.tool_id, self.prev_calls, self.streamed_args, self.streamed_raw, self.name_sent = 0, [], [""], 0, False
        while len(self.prev_calls) <= self.tool_id:
            self.prev_calls.append({})
        while len(self.streamed_args) <= self.tool_id:
            self.streamed_args.append("")
        calls = []
        if not self.name_sent:
            calls.append(ToolCallItem(self.tool_id, name, ""))
            self.name_sent, self.streamed_raw = True, 0
            self._args = _ArgumentStream(name, self.tools)
            self.prev_calls[self.tool_id] = {"name": name, "arguments": {}}
        if len(args_raw) > self.streamed_raw:
            piece = self._args.feed(args_raw[self.streamed_raw:])
            self.streamed_raw = len(args_raw)
            if piece:
                calls.append(self._sent(piece))
        if closed == EOT:
            calls.append(self._sent("{}" if self._args.first else "}"))
            pairs = _ARG.findall(args_raw)
            if pairs:
                self.prev_calls[self.tool_id]["arguments"] = parse_argument_pairs(pairs, name, self.tools)
            self.buffer = text[match_end:]
            self.tool_id += 1
            self.name_sent, self.streamed_raw = False, 0
            self._args = _ArgumentStream(name, self.tools)
        return calls

    def _sent(self, piece: str) -> ToolCallItem:
        self.streamed_args[self.tool_id] += piece
        return ToolCallItem(self.tool_id, None, piece)


# -- tool_choice required or named: a JSON array under a grammar ----------------------------------------


def _tool_schema(tool: ToolDef) -> dict[str, Any]:
    parameters = tool.parameters if tool.parameters else {"type": "object", "properties": {}}
    return {"properties": {"name": {"type": "string", "enum": [tool.name]}, "parameters": parameters},
            "required": ["name", "parameters"]}


def required_schema(tools: list[ToolDef], named: str | None, parallel: bool) -> dict[str, Any]:
    """The JSON schema SGLang constrains a required (named None) or named call with: an array of at
    least one {"name", "parameters"} object (at most one without parallel calls)."""
    if named is not None:
        items = _tool_schema(next(t for t in tools if t.name == named))
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": items}
    else:
        schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": [_tool_schema(t) for t in tools]}}
        defs: dict[str, Any] = {}
        for tool in tools:
            for name, sub in (tool.parameters.get("$defs", {}) if isinstance(tool.parameters, dict) else {}).items():
                if name in defs and defs[name] != sub:
                    raise ValueError(f"Tool definition '{name}' has multiple schemas, which is not supported.")
                defs[name] = sub
        if defs:
            schema["$defs"] = defs
    if not parallel:
        schema["maxItems"] = 1
    return schema


def required_parse(text: str) -> list[ToolCallItem] | None:
    """The constrained reply read back as SGLang reads it (a JSON array, or one object), every call
    kept whatever its name; None when it is not that (a reply cut by max_tokens)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    data = [data] if isinstance(data, dict) else data
    if not isinstance(data, list) or not all(isinstance(call, dict) and "name" in call for call in data):
        return None
    return [ToolCallItem(i, call["name"], json.dumps(call.get("parameters", {}), ensure_ascii=False))
            for i, call in enumerate(data)]


@dataclass
class RequiredStream:
    """A streamed required/named reply: each array element is sent once it is complete, its name
    then its arguments (SGLang streams the arguments in partial-JSON pieces; what a client
    assembles is the same)."""

    buffer: str = ""
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    start: int | None = None
    count: int = 0

    def feed(self, new_text: str) -> tuple[str, list[ToolCallItem]]:
        calls: list[ToolCallItem] = []
        for char in new_text:
            self.buffer += char
            if self.in_string:
                self.escaped, self.in_string = (False, True) if self.escaped else (char == "\\", char != '"')
                continue
            if char == '"':
                self.in_string = True
            elif char in "[{":
                self.depth += 1
                if self.depth == 2:
                    self.start = len(self.buffer) - 1
            elif char in "]}":
                if self.depth == 2 and self.start is not None:
                    calls += self._element(self.buffer[self.start:])
                    self.start = None
                self.depth -= 1
        return "", calls

    def _element(self, text: str) -> list[ToolCallItem]:
        try:
            call = json.loads(text)
        except ValueError:
            return []
        if not isinstance(call, dict) or "name" not in call:
            return []
        index, self.count = self.count, self.count + 1
        return [ToolCallItem(index, call["name"], ""),
                ToolCallItem(index, None, json.dumps(call.get("parameters", {}), ensure_ascii=False))]

    def end(self) -> tuple[str, list[ToolCallItem]]:
        return "", []

    def unstreamed(self) -> ToolCallItem | None:
        return None


# -- one request's tools --------------------------------------------------------------------------------


@dataclass
class ToolUse:
    """What a chat request's tools mean for its reply (SGLang's serving_chat): `parser` None when
    the server parses no tool calls (no --tool-call-parser, no tools, tool_choice "none", or a JSON
    response_format, whose JSON is the answer); `forced` when the reply must be a call (tool_choice
    "required" or a named function), which a JSON-array grammar makes it."""

    tools: list[ToolDef] = field(default_factory=list)
    parser: str | None = None
    forced: bool = False
    named: str | None = None
    parallel: bool = True

    def constraint(self) -> tuple[str, str] | None:
        """The grammar a forced call is written under (SGLang applies it with or without a parser)."""
        if not self.forced:
            return None
        return "json_schema", json.dumps(required_schema(self.tools, self.named, self.parallel))

    def read(self, text: str) -> tuple[str, list[ToolCallItem]] | None:
        """A whole reply: (its content, its calls), or None when it stays as it is (SGLang's
        _process_tool_calls: a forced reply that is not the array, a reply with no call marker;
        a marker without a complete call keeps the text before it)."""
        if self.parser is None:
            return None
        if self.forced:
            calls = required_parse(text)
            return None if calls is None else ("", calls)
        if not self.tools or BOT not in text:
            return None
        return ling3_parse(text, self.tools)

    def stream(self) -> Ling3Stream | RequiredStream | None:
        if self.parser is None:
            return None
        return RequiredStream() if self.forced else Ling3Stream(self.tools)
