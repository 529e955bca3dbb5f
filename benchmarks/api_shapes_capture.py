"""Capture how a server answers the requests of issue 28 (batches, n, sampling fields, grammars,
error bodies, the Ollama and small routes, /metrics), to compare the embedded engine with a real
SGLang 0.5.23 on the same tiny-ling.

    python benchmarks/api_shapes_capture.py capture URL OUT.json      # against a live server
    python benchmarks/api_shapes_capture.py compare A.json B.json     # the shapes that differ

`capture` records, per request, the status, the content type and the body (JSON, SSE data lines,
NDJSON lines or text). `compare` reduces each body to its shape (keys and value types, recursively;
the metric names and label sets for /metrics) and prints where two captures differ; exit 1 if any.
Run in the H200 session (benchmarks/sglang_h200/session.sh, step main) against SGLang serving the
tiny-ling export, and here against the embedded engine (REHEARSE=1 does both on CPU).
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import httpx

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
CHAT = [{"role": "user", "content": "Hello"}]
ENUM_SCHEMA = {"type": "object", "properties": {"mood": {"enum": ["calm", "wild"]}}, "required": ["mood"]}

REQUESTS: list[tuple[str, str, str, Any]] = [  # (name, method, path, JSON body)
    ("generate-batch", "POST", "/generate", {"text": ["The cat", "Once upon"], "sampling_params": GREEDY}),
    ("generate-one-item-list", "POST", "/generate", {"input_ids": [[84, 104, 101]], "sampling_params": GREEDY}),
    ("generate-n2", "POST", "/generate", {"text": "The cat", "sampling_params": {**GREEDY, "temperature": 1.0, "n": 2}}),
    ("generate-batch-stream", "POST", "/generate", {"text": ["The cat", "Once"], "stream": True, "sampling_params": GREEDY}),
    ("generate-stop-token", "POST", "/generate", {"text": "Once upon a time", "sampling_params": {**GREEDY, "stop_token_ids": [32]}}),
    ("generate-penalties", "POST", "/generate", {"text": "count: one two", "sampling_params": {
        **GREEDY, "frequency_penalty": 0.5, "presence_penalty": 0.5, "repetition_penalty": 1.2, "min_p": 0.1,
        "min_new_tokens": 4, "logit_bias": {"111": -100}}}),
    ("generate-regex", "POST", "/generate", {"text": "Answer:", "sampling_params": {"max_new_tokens": 8, "regex": "(yes|no)"}}),
    ("generate-bad-schema", "POST", "/generate", {"text": "x", "sampling_params": {"json_schema": "{nope"}}),
    ("generate-two-grammars", "POST", "/generate", {"text": "x", "sampling_params": {"regex": "a", "ebnf": "root ::= \"a\""}}),
    ("chat-n2", "POST", "/v1/chat/completions", {"messages": CHAT, "n": 2, "max_tokens": 8, "temperature": 1.0}),
    ("chat-n2-stream", "POST", "/v1/chat/completions", {"messages": CHAT, "n": 2, "max_tokens": 6, "stream": True,
                                                         "stream_options": {"include_usage": True}}),
    ("chat-json-schema", "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 30, "response_format": {
        "type": "json_schema", "json_schema": {"name": "m", "schema": ENUM_SCHEMA}}}),
    ("chat-bad-max-tokens", "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": -1}),
    ("completions-batch-echo", "POST", "/v1/completions", {"prompt": [[84, 104, 101], [79, 110]], "max_tokens": 1,
                                                            "logprobs": 1, "echo": True, "temperature": 0}),
    ("completions-bad-penalty", "POST", "/v1/completions", {"prompt": "x", "frequency_penalty": 3}),
    ("embeddings", "POST", "/v1/embeddings", {"input": "hi", "model": "default"}),
    ("ollama-tags", "GET", "/api/tags", None),
    ("ollama-show", "POST", "/api/show", {"model": "tiny-ling"}),
    ("ollama-generate", "POST", "/api/generate", {"model": "m", "prompt": "Once", "stream": False,
                                                  "options": {"num_predict": 8, "temperature": 0}}),
    ("ollama-chat-stream", "POST", "/api/chat", {"model": "m", "messages": CHAT, "options": {"num_predict": 6, "temperature": 0}}),
    ("ollama-default-num-predict", "POST", "/api/generate", {"model": "m", "prompt": "hi", "stream": False}),
    ("root", "GET", "/", None),
    ("root-head", "HEAD", "/", None),
    ("ping", "GET", "/ping", None),
    ("not-found", "GET", "/nowhere", None),
    ("metrics", "GET", "/metrics", None),
]


def samples(body: Any) -> bool:
    """Whether a request samples (a temperature above 0, or none given: SGLang's default is 1.0)."""
    if not isinstance(body, dict) or "messages" not in body and "prompt" not in body and "text" not in body \
            and "input_ids" not in body:
        return False
    params = body.get("sampling_params") or body.get("options") or body
    return float(params.get("temperature", 1.0)) > 0


def capture(url: str) -> dict[str, Any]:
    out = {}
    # Greedy requests first: SGLang's NEXTN verify step without flashinfer dies on the first sampled
    # request (H200 session 7 lost 24 of the 26 requests to that), so those go last.
    ordered = sorted(REQUESTS, key=lambda r: samples(r[3]))
    with httpx.Client(base_url=url, timeout=300) as client:
        for name, method, path, body in ordered:
            try:
                response = client.request(method, path, json=body)
            except httpx.HTTPError as exc:
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            kind = response.headers.get("content-type", "").split(";")[0]
            text = response.text
            if kind == "text/event-stream":
                parsed: Any = [json.loads(line[5:]) if line[5:].strip() != "[DONE]" else "[DONE]"
                               for line in text.splitlines() if line.startswith("data:")]
            elif kind == "application/x-ndjson":
                parsed = [json.loads(line) for line in text.splitlines() if line.strip()]
            elif kind == "application/json":
                parsed = response.json() if text else None
            else:
                parsed = text
            out[name] = {"status": response.status_code, "content_type": kind, "body": parsed}
    return out


def shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        shapes = []
        for item in value:
            s = shape(item)
            if s not in shapes:
                shapes.append(s)
        return shapes
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    if isinstance(value, (int, float)):
        return "number"
    return "str"


def metric_shape(text: str) -> list[str]:
    """Each sample's name and label names (values dropped but for the label sets' fixed ones)."""
    out = set()
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        match = re.match(r"([^{ ]+)(?:\{([^}]*)\})?", line)
        labels = sorted(p.split("=")[0] for p in (match.group(2) or "").split(",") if p)
        out.add(f"{match.group(1)}{{{','.join(labels)}}}")
    return sorted(out)


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    problems = []
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if x is None or y is None:
            problems.append(f"{name}: only in {'the first' if y is None else 'the second'}")
            continue
        for key in ("status", "content_type"):
            if x.get(key) != y.get(key):
                problems.append(f"{name}: {key} {x.get(key)!r} != {y.get(key)!r}")
        if name == "metrics":
            mx, my = set(metric_shape(x.get("body") or "")), set(metric_shape(y.get("body") or ""))
            for missing in sorted(my - mx):
                problems.append(f"metrics: only in the second: {missing}")
            for extra in sorted(mx - my):
                problems.append(f"metrics: only in the first: {extra}")
        elif shape(x.get("body")) != shape(y.get("body")):
            problems.append(f"{name}: body shapes differ:\n  {json.dumps(shape(x.get('body')))}\n  {json.dumps(shape(y.get('body')))}")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "capture":
        with open(argv[2], "w") as f:
            json.dump(capture(argv[1]), f, indent=1)
        print(f"captured {len(REQUESTS)} requests into {argv[2]}")
        return 0
    if len(argv) == 3 and argv[0] == "compare":
        problems = compare(json.load(open(argv[1])), json.load(open(argv[2])))
        print("\n".join(problems) or "the same shapes")
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
