"""Issue 37, items 2 and 3, as a user meets them: the default recipe (`sparkit up`'s, recipes/tiny/
tiny.yaml, started through the same plan and startup checks) serving structured output that
finishes and tool calls, driven by the real client packages, unmodified: openai (response_format,
`.parse`, the tools loop with tool_choice required and named), langchain (`with_structured_output`,
`bind_tools` with the tool forced, then the ToolMessage round trip), the `ollama` package (`format`,
`tools` with a tool result in the history). A reply tiny-ling writes in Ling 3.0's tool-call format
is read as SGLang 0.5.23's own ling3 parser reads the same text.

tiny-ling was never trained on JSON or tools: the schemas bound every value (strings by maxLength,
integers by maximum, enums), which is what makes its answers end (README: Structured output)."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

pytest.importorskip("torch")


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)
    student: bool
    mood: Literal["calm", "wild"]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city over the next days",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}
PING = {"type": "function", "function": {"name": "ping", "description": "Is the service up",
                                         "parameters": {"type": "object", "properties": {}}}}
# A tool as the `ollama` client sends it (its Tool model keeps type, required, properties, in that
# order, and of a property only type, items, description and enum)
OLLAMA_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city over the next days",
    "parameters": {"type": "object", "required": ["city", "days"],
                   "properties": {"city": {"type": "string", "description": "the city"},
                                  "days": {"type": "integer", "description": "how many days"}}}}}
# Ling 3.0's call format, values bounded: tiny-ling writes its own words into it
LING3_CALL = (r"Checking\.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>[A-Za-z ]{1,10}</arg_value>\n"
              r"<arg_key>days</arg_key>\n<arg_value>[1-7]</arg_value>\n</tool_call>")


@pytest.fixture(scope="module")
def default_recipe():
    import sparkit
    from sparkit.runs import free_port

    plan = sparkit.compile_plan(sparkit.load_recipe("tiny"), port=free_port())
    with sparkit.transient_server(plan, checks=True) as started:
        yield started


@pytest.fixture(scope="module")
def url(default_recipe) -> str:
    return default_recipe.server.url


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_the_default_recipe_says_tool_parsing_is_on_and_runs_compact_json(default_recipe, url):
    from sparkit import Status

    checks = {r.name: r for r in default_recipe.checks}
    assert checks["tool_calls"].status is Status.PASS and "ling3" in checks["tool_calls"].detail
    assert default_recipe.ok, [(r.name, r.detail) for r in default_recipe.failed_checks]
    info = httpx.get(url + "/server_info", timeout=30).json()
    assert info["tool_call_parser"] == "ling3" and info["constrained_json_disable_any_whitespace"] is True


# -- structured output that finishes ----------------------------------------------------------------


def test_response_format_json_schema_and_json_object_finish_with_valid_json(url):
    client = _client(url)
    schema = {"name": "person", "schema": Person.model_json_schema()}
    for prompt, seed in [("Describe a person.", None), ("Hello", None), ("Who is it?", 0), ("Tell me.", 1), ("Hi", 2)]:
        sampling = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
        reply = client.chat.completions.create(model="tiny-ling", messages=[{"role": "user", "content": prompt}],
                                               max_tokens=200, response_format={"type": "json_schema", "json_schema": schema},
                                               **sampling)
        assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
        Person.model_validate_json(reply.choices[0].message.content)
    loose = client.chat.completions.create(model="tiny-ling", messages=[{"role": "user", "content": "JSON please"}],
                                           max_tokens=200, temperature=0, response_format={"type": "json_object"})
    assert loose.choices[0].finish_reason == "stop" and isinstance(json.loads(loose.choices[0].message.content), dict)


def test_native_json_schema_on_generate_finishes(url):
    body = {"text": "A person: ", "sampling_params": {"max_new_tokens": 200, "temperature": 0,
                                                      "json_schema": json.dumps(Person.model_json_schema())}}
    out = httpx.post(url + "/generate", json=body, timeout=300).json()
    assert out["meta_info"]["finish_reason"]["type"] == "stop", out["text"]
    Person.model_validate_json(out["text"])


def test_openai_parse_gives_the_pydantic_object(url):
    reply = _client(url).chat.completions.parse(model="tiny-ling", messages=[{"role": "user", "content": "Who?"}],
                                                response_format=Person, max_tokens=200, temperature=0)
    assert reply.choices[0].finish_reason == "stop" and isinstance(reply.choices[0].message.parsed, Person)


def test_langchain_with_structured_output(url):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=url + "/v1", api_key="unused", model="tiny-ling", temperature=0, max_tokens=200, max_retries=0)
    assert isinstance(llm.with_structured_output(Person).invoke("Describe a student."), Person)
    raw = llm.with_structured_output(Person, include_raw=True).invoke("Describe a teacher.")
    assert raw["parsing_error"] is None and isinstance(raw["parsed"], Person)
    assert raw["raw"].response_metadata["finish_reason"] == "stop"


def test_ollama_format_schema_and_json_finish(url):
    import ollama

    client = ollama.Client(host=url)
    shaped = client.chat(model="tiny-ling", messages=[{"role": "user", "content": "Who?"}], format=Person.model_json_schema(),
                         options={"num_predict": 200, "temperature": 0})
    assert shaped.done_reason == "stop"
    Person.model_validate_json(shaped.message.content)
    # "json" has no schema to bound it: after the chat template tiny-ling closes the object at once
    # (a raw /api/generate prompt can run to num_predict; README: Structured output)
    loose = client.chat(model="tiny-ling", messages=[{"role": "user", "content": "JSON:"}], format="json",
                        options={"num_predict": 200, "temperature": 0})
    assert loose.done_reason == "stop" and isinstance(json.loads(loose.message.content), dict)


# -- tool calls ----------------------------------------------------------------------------------------


def _weather(city: str, days: int) -> str:
    return f"{city}: sunny for {days} days"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_the_openai_tools_loop(url, choice):
    """Call, run the tool, send its result back, get the answer: the loop agents run."""
    client = _client(url)
    messages = [{"role": "user", "content": "What is the weather in Paris this week?"}]
    first = client.chat.completions.create(model="tiny-ling", messages=messages, tools=[WEATHER, PING], tool_choice=choice,
                                           parallel_tool_calls=False, max_tokens=200, temperature=0)
    picked = first.choices[0]
    assert picked.finish_reason == "tool_calls" and len(picked.message.tool_calls) == 1
    call = picked.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    if isinstance(choice, dict):
        assert call.function.name == "get_weather"
    streamed, pieces = None, {}
    for chunk in client.chat.completions.create(model="tiny-ling", messages=messages, tools=[WEATHER, PING], tool_choice=choice,
                                                parallel_tool_calls=False, max_tokens=200, temperature=0, stream=True):
        for delta in chunk.choices[0].delta.tool_calls or []:
            name, arguments = pieces.get(delta.index, (None, ""))
            pieces[delta.index] = (delta.function.name or name, arguments + (delta.function.arguments or ""))
        streamed = chunk.choices[0].finish_reason or streamed
    assert streamed == "tool_calls" and pieces == {0: (call.function.name, call.function.arguments)}
    arguments = json.loads(call.function.arguments)
    result = _weather(**arguments) if call.function.name == "get_weather" else "pong"
    messages += [picked.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": result}]
    answer = client.chat.completions.create(model="tiny-ling", messages=messages, tools=[WEATHER, PING], max_tokens=60,
                                            temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length") and answer.choices[0].message.content
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens + len(result)  # the call and its result are in the prompt


def test_langchain_bind_tools_with_the_tool_forced_then_its_result(url):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str = Field(max_length=12), days: int = Field(ge=1, le=7)) -> str:
        """The weather in a city over the next days."""
        return _weather(city, days)

    llm = ChatOpenAI(base_url=url + "/v1", api_key="unused", model="tiny-ling", temperature=0, max_tokens=200, max_retries=0)
    forced = llm.bind_tools([get_weather], tool_choice="get_weather", parallel_tool_calls=False)
    question = HumanMessage("Weather in Oslo for three days?")
    reply = forced.invoke([question])
    assert [c["name"] for c in reply.tool_calls] == ["get_weather"] and not reply.invalid_tool_calls
    call = reply.tool_calls[0]
    result = get_weather.invoke(call["args"])
    assert isinstance(call["args"]["city"], str) and 1 <= call["args"]["days"] <= 7
    answer = llm.bind_tools([get_weather]).invoke([question, reply, ToolMessage(result, tool_call_id=call["id"])])
    assert isinstance(answer.content, str) and answer.content and not answer.tool_calls


def test_a_call_tiny_ling_writes_in_ling3s_format_is_read_as_sglangs_parser_reads_it(url):
    """tool_choice auto: the call is the model's own text (here held to Ling 3.0's format by a
    regex, which SGLang also applies with tools), read by the server's ling3 parser; SGLang's
    FunctionCallParser on the very same text (the reply's tokens, from its logprobs) agrees."""
    from embedded_server.test_tool_calls import _sglang_tools, _stand_in_partial_json_parser

    client = _client(url)
    ask = dict(model="tiny-ling", messages=[{"role": "user", "content": "Weather in Rome?"}], tools=[WEATHER, PING],
               max_tokens=250, temperature=0, extra_body={"regex": LING3_CALL})
    reply = client.chat.completions.create(logprobs=True, **ask)
    choice = reply.choices[0]
    text = b"".join(bytes(t.bytes) for t in choice.logprobs.content).decode()
    assert text.startswith("Checking.<tool_call>get_weather\n") and choice.finish_reason == "tool_calls"
    pytest.importorskip("sglang")
    _stand_in_partial_json_parser()
    from types import SimpleNamespace

    from sglang.srt.entrypoints.openai.protocol import Tool
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    tools = _sglang_tools(SimpleNamespace(Tool=Tool), [WEATHER["function"], PING["function"]])
    content, calls = FunctionCallParser(tools, "ling3").parse_non_stream(text)
    assert choice.message.content == content == "Checking."
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [(c.name, c.parameters) for c in calls]
    streamed, pieces = "", {}
    for chunk in client.chat.completions.create(stream=True, **ask):
        delta = chunk.choices[0].delta if chunk.choices else None
        streamed += (delta.content or "") if delta else ""
        for piece in (delta.tool_calls or []) if delta else []:
            name, arguments = pieces.get(piece.index, (None, ""))
            pieces[piece.index] = (piece.function.name or name, arguments + (piece.function.arguments or ""))
    # SGLang's ling3 stream drops the text that shares a chunk with the call's start, and how the
    # engine's steps fall into chunks depends on the machine: what arrives is a prefix
    assert "Checking.".startswith(streamed) and [(n, json.loads(a)) for n, a in pieces.values()] == \
        [(c.name, json.loads(c.parameters)) for c in calls]


def test_ollama_tools_with_a_tool_result_in_the_history(url):
    """Ollama's shapes (a call's arguments an object, a result's tool_name) reach the template as the
    OpenAI route's do: the same conversation is the same prompt."""
    import ollama

    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                                 "arguments": {"city": "Paris", "days": 2}}}]},
               {"role": "tool", "content": "Paris: sunny for 2 days", "tool_name": "get_weather"}]
    reply = ollama.Client(host=url).chat(model="tiny-ling", messages=history, tools=[OLLAMA_WEATHER],
                                         options={"num_predict": 30, "temperature": 0})
    assert reply.done and reply.message.content and not reply.message.tool_calls
    as_openai = [history[0], {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": history[2]["content"]}]
    same = _client(url).chat.completions.create(model="tiny-ling", messages=as_openai, tools=[OLLAMA_WEATHER], max_tokens=30,
                                                temperature=0)
    assert reply.prompt_eval_count == same.usage.prompt_tokens and reply.message.content == same.choices[0].message.content
