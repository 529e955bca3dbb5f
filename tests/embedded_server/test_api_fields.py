"""The embedded engine declares every request field the installed SGLang and openai define.

The field lists come from the installed packages themselves: SGLang's GenerateReqInput (read from
its source: io_struct imports GPU-only modules) and its /generate API contract
(sglang.api.v1.api_types), its sampling_params contract, its OpenAI protocol models, and the
openai client's request types. A field SGLang or OpenAI adds fails here until requests.py
declares it (honoured, or NEUTRAL with the values that mean "off")."""

from __future__ import annotations

import ast
import json
from typing import Any

import pytest
from sglang_plugin._sglang_source import find_class, module_ast

from sparkit.engines.embedded import requests

msgspec = pytest.importorskip("msgspec")

UNREADABLE = object()  # a default the source does not spell as a literal


def dataclass_fields_from_source(module: str, cls: str) -> dict[str, Any]:
    """A dataclass's field names and literal defaults, read from the installed source."""
    node = find_class(module_ast(module), cls)
    assert node is not None, f"{module}.{cls} is not in the installed sglang"
    fields: dict[str, Any] = {}
    for statement in node.body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        value = statement.value
        if isinstance(value, ast.Call):  # field(default=..., kw_only=True)
            keywords = {k.arg: k.value for k in value.keywords}
            value = keywords.get("default")
        try:
            fields[statement.target.id] = ast.literal_eval(value) if value is not None else UNREADABLE
        except ValueError:
            fields[statement.target.id] = UNREADABLE
    return fields


def struct_fields(struct: type) -> dict[str, Any]:
    return {f.name: (UNREADABLE if f.default is msgspec.NODEFAULT else f.default) for f in msgspec.structs.fields(struct)}


def pydantic_fields(model: type) -> dict[str, Any]:
    return {name: (UNREADABLE if info.is_required() else info.get_default(call_default_factory=True))
            for name, info in model.model_fields.items()}


def openai_fields(module: Any) -> dict[str, Any]:
    """Every key of the openai client's request TypedDicts of `module` (no defaults: null)."""
    names: set[str] = set()
    for attr in dir(module):
        value = getattr(module, attr)
        if attr.startswith("CompletionCreateParams") and isinstance(value, type):  # the TypedDicts, not the Union
            names |= set(value.__annotations__)
    return {name: None for name in names}


def generate_fields() -> dict[str, Any]:
    from sglang.api.v1.api_types import GenerateRequest

    fields = dataclass_fields_from_source("sglang.srt.managers.io_struct", "GenerateReqInput")
    for name, default in struct_fields(GenerateRequest).items():
        fields.setdefault(name, default)
    return fields


def sampling_fields() -> dict[str, Any]:
    from sglang.api.v1.api_types import SamplingParams

    return struct_fields(SamplingParams)  # the API contract (the srt struct adds internal fields)


def completion_fields() -> dict[str, Any]:
    from openai.types import completion_create_params
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest

    return {**openai_fields(completion_create_params), **pydantic_fields(CompletionRequest)}


def chat_fields() -> dict[str, Any]:
    from openai.types.chat import completion_create_params
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    return {**openai_fields(completion_create_params), **pydantic_fields(ChatCompletionRequest)}


CASES = {
    "/generate": (requests.GenerateRequest, generate_fields, {"text": "hi"}),
    "/generate sampling_params": (requests.GenerateSamplingParams, sampling_fields, {}),
    "/v1/completions": (requests.CompletionRequest, completion_fields, {"prompt": "hi"}),
    "/v1/chat/completions": (requests.ChatCompletionRequest, chat_fields, {"messages": [{"role": "user", "content": "hi"}]}),
}


def declared(model: type) -> set[str]:
    return set(model.model_fields) | set(model.NEUTRAL)


@pytest.mark.parametrize("where", list(CASES))
def test_every_field_sglang_or_openai_defines_is_declared(where):
    model, fields, _ = CASES[where]
    missing = sorted(set(fields()) - declared(model))
    assert not missing, (f"{where}: the installed sglang/openai define {missing}, which protocol.py does not "
                         f"declare: honour them, or add them to {model.__name__}.NEUTRAL with their off values")


@pytest.mark.parametrize("where", list(CASES))
def test_no_declared_field_is_made_up(where):
    model, fields, _ = CASES[where]
    foreign = sorted(declared(model) - set(fields()))
    assert not foreign, f"{where}: {foreign} are declared but neither sglang nor openai defines them"


@pytest.mark.parametrize("where", list(CASES))
def test_one_body_with_every_field_at_its_sglang_default_is_accepted(where):
    model, fields, required = CASES[where]
    body = {name: default for name, default in fields().items() if default is not UNREADABLE}
    body.update(required)
    if model is requests.GenerateSamplingParams:
        body = {"text": "hi", "sampling_params": body}
        model = requests.GenerateRequest
    ignored: list[str] = []
    requests.parse_body(json.dumps(body).encode(), model, where, ignored)
    assert ignored == []  # every key was declared, none merely ignored


@pytest.mark.parametrize("where", list(CASES))
def test_a_neutral_only_field_at_another_value_is_a_400_naming_it(where):
    model, _, required = CASES[where]
    checked = 0
    for name, allowed in model.NEUTRAL.items():
        if allowed in (requests.ANY, requests.IGNORED):
            continue
        body: dict[str, Any] = {**required, name: "sparkit-probe"}
        if model is requests.GenerateSamplingParams:
            body, target = {"text": "hi", "sampling_params": body}, requests.GenerateRequest
        else:
            target = model
        with pytest.raises(requests.ApiError) as info:
            requests.parse_body(json.dumps(body).encode(), target, where)
        assert info.value.status == 400
        assert f'{name}="sparkit-probe" is not supported by the embedded engine (it takes only null' in info.value.message
        checked += 1
    assert checked > 5


def test_fields_stock_sglang_accepts_and_that_mean_nothing_here_are_accepted_and_named():
    """Issue 37, item 5: `reasoning_effort` (what the openai and litellm clients send for any model)
    was a 400; SGLang takes it. Accepted, and named in x-sparkit-ignored-fields."""
    body = {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low", "store": True,
            "service_tier": "flex", "verbosity": "low", "bootstrap_host": "10.0.0.1"}
    ignored: list[str] = []
    requests.parse_body(json.dumps(body).encode(), requests.ChatCompletionRequest, "/v1/chat/completions", ignored)
    assert sorted(ignored) == ["bootstrap_host", "reasoning_effort", "service_tier", "store", "verbosity"]
    quiet: list[str] = []  # at their off values they are not worth a mention
    requests.parse_body(json.dumps({"messages": body["messages"], "store": False, "reasoning_effort": None}).encode(),
                        requests.ChatCompletionRequest, "/v1/chat/completions", quiet)
    assert quiet == []
    sglang_chat = pytest.importorskip("sglang.srt.entrypoints.openai.protocol").ChatCompletionRequest
    for model in (requests.ChatCompletionRequest, requests.CompletionRequest):
        for name, allowed in model.NEUTRAL.items():
            if allowed == requests.IGNORED:  # each one a field SGLang or OpenAI defines, not one made up
                assert name in sglang_chat.model_fields or name in chat_fields() or name in completion_fields(), name
