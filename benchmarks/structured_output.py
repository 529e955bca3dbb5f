"""How often constrained output finishes on tiny-ling: the default recipe (compact JSON) against
SGLang's default whitespace (`--set server.constrained_json.disable_any_whitespace=false`), in the
same run, each a real server that `sparkit up`'s plan starts (issue 37, item 2).

    python benchmarks/structured_output.py [--samples N] [--json]

For each schema: the share of replies that end on their own (finish reason `stop`) with JSON that
the schema's Pydantic model accepts, and their mean length in tokens, over 4 prompts, greedy and N
seeds at temperature 1. Tool calls with tool_choice "required" and a named function (one call,
parallel_tool_calls false) are counted the same way: finish reason `tool_calls` with arguments the
tool's schema accepts.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Literal

import httpx
from pydantic import BaseModel, Field, ValidationError


class Bounded(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)
    student: bool
    mood: Literal["calm", "wild"]


class UnboundedString(BaseModel):
    name: str
    student: bool


class UnboundedInteger(BaseModel):
    age: int
    student: bool


class Number(BaseModel):
    temperature: float
    rain: bool


class Weather(BaseModel):
    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=7)


SCHEMAS = {"bounded (maxLength, maximum, bool, enum)": Bounded, "unbounded string": UnboundedString,
           "unbounded integer": UnboundedInteger, "number": Number, "json_object": None}
PROMPTS = ["Describe a person.", "Hello", "What is the weather?", "Tell me about it."]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather",
                                         "parameters": Weather.model_json_schema()}}


def _sampling(samples: int) -> list[dict]:
    return [{"temperature": 0}] + [{"temperature": 1.0, "seed": s} for s in range(samples)]


def _json_ok(model: type[BaseModel] | None, text: str) -> bool:
    try:
        if model is None:
            return isinstance(json.loads(text), dict)
        model.model_validate_json(text)
        return True
    except (ValidationError, ValueError):
        return False


def _ask(url: str, body: dict) -> dict:
    return httpx.post(url + "/v1/chat/completions", json={"model": "tiny-ling", "max_tokens": 200, **body}, timeout=600).json()


def measure(url: str, samples: int) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for label, model in SCHEMAS.items():
        fmt = ({"type": "json_object"} if model is None else
               {"type": "json_schema", "json_schema": {"name": "x", "schema": model.model_json_schema()}})
        outcomes = []
        for prompt in PROMPTS:
            for sampling in _sampling(samples):
                reply = _ask(url, {"messages": [{"role": "user", "content": prompt}], "response_format": fmt, **sampling})
                choice = reply["choices"][0]
                outcomes.append((choice["finish_reason"] == "stop" and _json_ok(model, choice["message"]["content"]),
                                 reply["usage"]["completion_tokens"]))
        rows[label] = _row(outcomes)
    for label, choice in (("tool_choice required", "required"),
                          ("tool_choice named", {"type": "function", "function": {"name": "get_weather"}})):
        outcomes = []
        for prompt in PROMPTS:
            for sampling in _sampling(samples):
                reply = _ask(url, {"messages": [{"role": "user", "content": prompt}], "tools": [TOOL], "tool_choice": choice,
                                   "parallel_tool_calls": False, **sampling})
                picked = reply["choices"][0]
                calls = picked["message"]["tool_calls"] or []
                ok = picked["finish_reason"] == "tool_calls" and len(calls) == 1 and _json_ok(Weather, calls[0]["function"]["arguments"])
                outcomes.append((ok, reply["usage"]["completion_tokens"]))
        rows[label] = _row(outcomes)
    return rows


def _row(outcomes: list[tuple[bool, int]]) -> dict:
    return {"finished_valid": sum(ok for ok, _ in outcomes), "of": len(outcomes),
            "mean_tokens": round(sum(n for _, n in outcomes) / len(outcomes), 1)}


def main() -> int:
    import sparkit
    from sparkit.runs import free_port

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=4, help="seeds at temperature 1 per prompt (plus greedy)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {}
    for name, sets in (("default recipe (compact JSON)", []),
                       ("SGLang's default whitespace", ["server.constrained_json.disable_any_whitespace=false"])):
        print(f"serving: {name} ...", file=sys.stderr, flush=True)
        plan = sparkit.compile_plan(sparkit.load_recipe("tiny", sets), port=free_port())
        with sparkit.transient_server(plan) as started:
            results[name] = measure(started.server.url, args.samples)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    labels = list(next(iter(results.values())))
    print(f"{'schema':44}" + "".join(f"{name:>34}" for name in results))
    for label in labels:
        cells = [f"{r[label]['finished_valid']}/{r[label]['of']} valid, {r[label]['mean_tokens']:.0f} tok" for r in results.values()]
        print(f"{label:44}" + "".join(f"{c:>34}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
