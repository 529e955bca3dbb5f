"""The embedded engine reads tool calls as SGLang 0.5.23 reads them: sparkit's port of the ling3
parser (sparkit/engines/embedded/tool_calls.py) against SGLang's own FunctionCallParser on the
same texts, whole and streamed in chunks of several sizes, and the required/named call's JSON
schema against SGLang's own get_json_schema_constraint.

SGLang's parser runs on CPU. Its package imports `partial_json_parser` (a requirement of sglang
that the tests' --no-deps install of it leaves out); where that package is missing, the two names
the import needs are given a stand-in whose functions raise, so a code path of SGLang's that
needed the real package would fail the test rather than pass it quietly. The ling3 paths do not."""

from __future__ import annotations

import enum
import json
import sys
import types

import pytest

from sparkit.engines.embedded.tool_calls import (
    Ling3Stream,
    RequiredStream,
    ToolDef,
    ling3_parse,
    required_parse,
    required_schema,
)

# Importing SGLang's parser takes 10-20 s on a loaded machine: the tests that use it are slow.
compared = pytest.mark.slow


def _stand_in_partial_json_parser() -> None:
    try:
        import partial_json_parser  # noqa: F401
        return
    except ImportError:
        pass

    class MalformedJSON(Exception):
        pass

    class Allow(enum.IntFlag):
        STR, NUM, ARR, OBJ, NULL, BOOL, NAN, INFINITY, _INFINITY = (1 << i for i in range(9))
        INF = INFINITY | _INFINITY
        SPECIAL = NULL | BOOL | INF | NAN
        ATOM = STR | NUM | SPECIAL
        COLLECTION = ARR | OBJ
        ALL = ATOM | COLLECTION

    def loads(*args, **kwargs):
        raise AssertionError("SGLang called partial_json_parser, which this test environment lacks")

    root, core = types.ModuleType("partial_json_parser"), types.ModuleType("partial_json_parser.core")
    exceptions = types.ModuleType("partial_json_parser.core.exceptions")
    options = types.ModuleType("partial_json_parser.core.options")
    exceptions.MalformedJSON, options.Allow, root.loads = MalformedJSON, Allow, loads
    root.core, core.exceptions, core.options = core, exceptions, options
    sys.modules.update({"partial_json_parser": root, "partial_json_parser.core": core,
                        "partial_json_parser.core.exceptions": exceptions, "partial_json_parser.core.options": options})


@pytest.fixture(scope="module")
def sglang():
    pytest.importorskip("sglang")
    _stand_in_partial_json_parser()
    from sglang.srt.entrypoints.openai.protocol import Tool, ToolChoice
    from sglang.srt.function_call import utils
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    return types.SimpleNamespace(Tool=Tool, ToolChoice=ToolChoice, FunctionCallParser=FunctionCallParser, utils=utils)


TOOLS = [
    {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]},
        "ratio": {"type": "number"}}, "required": ["city"]}},
    {"name": "search", "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "filters": {"type": "object"}, "tags": {"type": "array", "items": {"type": "string"}},
        "exact": {"type": "boolean"}, "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}},
    {"name": "ping", "parameters": None},
]


def _call(name: str, *pairs: tuple[str, str], sep: str = "\n") -> str:
    args = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in pairs)
    return f"<tool_call>{name}{sep}{args}</tool_call>"


TEXTS = {
    "one call, text before it": "Let me look.\n" + _call("get_weather", ("city", "Paris"), ("days", "3")),
    "several calls": _call("get_weather", ("city", "Oslo")) + "\n" + _call("search", ("query", "rain")) + _call("ping"),
    "nested JSON arguments": _call("search", ("query", "x"), ("filters", '{"year": {"gte": 2020, "in": [1, 2]}, "a": null}'),
                                   ("tags", '["a", "b \\"c\\""]'), ("exact", "true")),
    "escaped quotes in a string": _call("search", ("query", 'He said "hi" and \\"bye\\"'), ("note", "a\\nb")),
    "a JSON object where a string is declared": _call("get_weather", ("city", '{"name": "Rome"}'), ("days", '"7"')),
    "numbers as text": _call("get_weather", ("city", "123"), ("ratio", "3.5"), ("days", "1e2"), ("unit", "c")),
    "undeclared arguments": _call("search", ("query", "q"), ("limit", "10"), ("deep", "{'a': True}"), ("raw", "plain words")),
    "no newline after the name": "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Lima</arg_value></tool_call>",
    "literal backslash-n separators": _call("get_weather", ("city", "Bern"), ("days", "2"), sep="\\n"),
    "a call of an unknown tool": _call("launch_rockets", ("count", "3")) + _call("ping"),
    "an unclosed call": "Sure " + "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Pa",
    "no call at all": "It is sunny in Paris.",
    "text after the call": _call("ping") + " and that is all",
    "unicode": _call("get_weather", ("city", "北京 — Zürich")),
    "python literal where JSON is expected": _call("search", ("filters", "{'k': [1, 2, None]}"), ("exact", "False")),
    "a stray closing tag": "done </tool_call> really",
    "empty value": _call("search", ("query", ""), ("tags", "[]")),
}


def _sglang_tools(sglang, tools=TOOLS):
    return [sglang.Tool(type="function", function={"name": t["name"], "parameters": t["parameters"]}) for t in tools]


def _ours(tools=TOOLS):
    return [ToolDef(t["name"], t["parameters"]) for t in tools]


def _items(calls) -> list[tuple]:
    return [(c.tool_index, c.name, c.parameters) for c in calls]


@compared
@pytest.mark.parametrize("case", list(TEXTS))
def test_a_whole_reply_reads_as_sglangs_ling3_parser_reads_it(sglang, case):
    text = TEXTS[case]
    theirs = sglang.FunctionCallParser(_sglang_tools(sglang), "ling3")
    their_text, their_calls = theirs.parse_non_stream(text)
    our_text, our_calls = ling3_parse(text, _ours())
    assert (our_text, _items(our_calls)) == (their_text, _items(their_calls))


def test_the_tricky_texts_do_give_calls():
    """The comparison above is worth something only if the texts exercise the parser."""
    parsed = {case: ling3_parse(text, _ours())[1] for case, text in TEXTS.items()}
    assert [c.name for c in parsed["several calls"]] == ["get_weather", "search", "ping"]
    nested = json.loads(parsed["nested JSON arguments"][0].parameters)
    assert nested["filters"] == {"year": {"gte": 2020, "in": [1, 2]}, "a": None} and nested["exact"] is True
    assert json.loads(parsed["escaped quotes in a string"][0].parameters)["query"] == 'He said "hi" and \\"bye\\"'
    assert json.loads(parsed["a JSON object where a string is declared"][0].parameters)["city"] == '{"name": "Rome"}'
    assert ling3_parse(TEXTS["one call, text before it"], _ours())[0] == "Let me look."
    assert [c.name for c in parsed["a call of an unknown tool"]] == ["ping"] and parsed["no call at all"] == []


def _chunks(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


@compared
@pytest.mark.parametrize("size", [1, 2, 5, 13, 10_000])
@pytest.mark.parametrize("case", list(TEXTS))
def test_a_streamed_reply_reads_as_sglangs_parser_reads_it_chunk_by_chunk(sglang, case, size):
    theirs = sglang.FunctionCallParser(_sglang_tools(sglang), "ling3")
    ours = Ling3Stream(_ours())
    for chunk in _chunks(TEXTS[case], size):
        their_text, their_calls = theirs.parse_stream_chunk(chunk)
        our_text, our_calls = ours.feed(chunk)
        assert (our_text, _items(our_calls)) == (their_text, _items(their_calls)), chunk
    their_end = theirs.parse_stream_end()
    assert (ours.end()[0], _items(ours.end()[1])) == (their_end[0], _items(their_end[1]))
    # what the server sends when the stream ends comes from these (serving_chat's unstreamed check)
    detector = theirs.detector
    assert (ours.prev_calls, ours.streamed_args) == (detector.prev_tool_call_arr, detector.streamed_args_for_tool)


def test_streamed_pieces_assemble_into_the_whole_replys_calls():
    text = TEXTS["nested JSON arguments"] + TEXTS["several calls"]
    stream, calls = Ling3Stream(_ours()), {}
    for chunk in _chunks(text, 3):
        for item in stream.feed(chunk)[1]:
            name, args = calls.get(item.tool_index, (None, ""))
            calls[item.tool_index] = (item.name or name, args + item.parameters)
    whole = ling3_parse(text, _ours())[1]
    assert [(n, json.loads(a)) for n, a in calls.values()] == [(c.name, json.loads(c.parameters)) for c in whole]


@compared
@pytest.mark.parametrize("named", [None, "search"])
@pytest.mark.parametrize("parallel", [True, False])
def test_the_required_and_named_call_schema_is_sglangs(sglang, named, parallel):
    tools = _sglang_tools(sglang)
    choice = "required" if named is None else sglang.ToolChoice(function={"name": named})
    theirs = sglang.utils.get_json_schema_constraint(tools, choice, parallel_tool_calls=parallel)
    assert required_schema(_ours(), named, parallel) == theirs


def test_a_required_reply_reads_back_as_sglang_reads_the_json_array():
    text = '[{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}, {"name": "ping", "parameters": {}}]'
    assert _items(required_parse(text)) == [(0, "get_weather", '{"city": "Paris", "days": 3}'), (1, "ping", "{}")]
    assert _items(required_parse('{"name": "ping"}')) == [(0, "ping", "{}")]  # one object is a call too
    assert required_parse('[{"name": "get_weather", "parameters": {"city": "Pa') is None  # cut by max_tokens
    assert required_parse('[{"parameters": {}}]') is None
    stream, calls = RequiredStream(), []
    for chunk in _chunks(text, 4):
        calls += stream.feed(chunk)[1]
    assert _items(calls) == [(0, "get_weather", ""), (0, None, '{"city": "Paris", "days": 3}'), (1, "ping", ""), (1, None, "{}")]
    stream, calls = RequiredStream(), []
    for chunk in _chunks('[{"name": "search", "parameters": {"query": "a \\"]}\\" b", "tags": ["}"]}}]', 1):
        calls += stream.feed(chunk)[1]
    assert json.loads(calls[1].parameters) == {"query": 'a "]}" b', "tags": ["}"]}


# -- tiny-ling's chat template writes what the parser reads ---------------------------------------------

# The template before tools (sparkit 0.1.0's): a conversation without them must render as it did.
TEMPLATE_WITHOUT_TOOLS = ("{{ bos_token }}{% for message in messages %}{{ '<|' + message['role'] + '|>' + "
                          "message['content'] + '<|eos|>' }}{% endfor %}{% if add_generation_prompt %}"
                          "{{ '<|assistant|>' }}{% endif %}")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from sparkit.models.tiny_ling.tokenizer import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def test_the_shipped_checkpoint_carries_the_template(tiny_model_dir):
    from sparkit.models.tiny_ling.tokenizer import CHAT_TEMPLATE

    assert (tiny_model_dir / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    assert json.loads((tiny_model_dir / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"},
     {"role": "user", "content": "count: one two"}],
])
def test_a_conversation_without_tools_renders_as_it_always_has(tokenizer, messages):
    for generation in (True, False):
        new = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
        assert new == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation,
                                                    chat_template=TEMPLATE_WITHOUT_TOOLS)


def test_an_assistants_calls_render_in_ling3s_format_and_read_back_as_they_were(tokenizer):
    arguments = [{"city": "Paris", "days": 3, "ratio": 0.5}, {"query": 'say "hi"', "filters": {"a": [1, None]},
                                                              "tags": ["x", "y"], "exact": False}, {}]
    names = ["get_weather", "search", "ping"]
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": "On it.", "tool_calls": [
                    {"type": "function", "function": {"name": n, "arguments": a}} for n, a in zip(names, arguments)]},
                {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "3 hits"}, {"role": "tool", "content": "pong"}]
    tools = [{"type": "function", "function": t} for t in TOOLS]
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.count("<tool_response>") == 3 and text.count("<|user|>") == 2  # the results share one turn
    assert text.startswith("<|bos|><|system|># Tools") and json.dumps(tools[0]) in text
    reply = text[text.index("<|assistant|>") + len("<|assistant|>"):text.index("<|eos|><|user|><tool_response>")]
    content, calls = ling3_parse(reply, _ours())
    assert content == "On it." and [(c.name, json.loads(c.parameters)) for c in calls] == list(zip(names, arguments))


def test_an_ollama_stream_sends_each_call_whole_once_it_closed():
    from sparkit.engines.embedded.routes import OllamaCalls

    text = "Sure." + _call("get_weather", ("city", "Oslo"), ("days", "2")) + _call("ping") + "<tool_call>search\n<arg_key>q"
    calls, content, sent = OllamaCalls(Ling3Stream(_ours())), "", []
    pieces = _chunks(text, 4)
    for i, chunk in enumerate(pieces):
        more, complete = calls.feed(chunk, i == len(pieces) - 1)
        content += more
        sent.append([(c.tool_index, c.name, json.loads(c.parameters)) for c in complete])
    # SGLang's ling3 stream drops text that shares a chunk with a call's start (here "."): so does this
    assert content == "Sure"
    assert [s for s in sent if s] == [[(0, "get_weather", {"city": "Oslo", "days": 2})], [(1, "ping", {})]]
    assert OllamaCalls(None).feed("text", True) == ("text", [])  # no parser: the text as it is
    whole = OllamaCalls(Ling3Stream(_ours())).feed(_call("launch_rockets") + _call("ping") + _call("ping") + "<tool_call>", True)
    assert [(c.tool_index, c.name) for c in whole[1]] == [(0, "ping"), (1, "ping")]  # as ling3_parse keeps them
