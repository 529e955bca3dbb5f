"""Response shapes of the embedded server's SGLang/OpenAI/Ollama HTTP API, made from what the
worker reports (RequestProgress). Pure data in, data out: no HTTP framework, no torch; routes.py
owns the sockets.

Shapes follow sglang 0.5.23 (sglang/srt/entrypoints/openai/protocol.py, serving_chat.py,
serving_completions.py, managers/tokenizer_manager.py): `meta_info` keys and logprob tuples
`(logprob, token_id, text-or-None)`, `sglext.spec_tokens_details`, the extra usage / sglext
chunks that close a stream, and `data: [DONE]`; the error bodies are SGLang's two shapes.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from sparkit.engines.embedded.api import TokenLogprobs
from sparkit.engines.embedded.tool_calls import ToolCallItem, new_call_id


def error_body(status: int, message: str, *, type: str = "BadRequestError", param: str | None = None,
               nested: bool = True) -> dict[str, Any]:
    """SGLang's two error shapes: its ErrorResponse, flat (`{"object": "error", "message", "type",
    "param", "code"}`: every route's 4xx/5xx but /generate's; the `openai` client raises its typed
    errors from it), and `{"error": {...}}` (/generate, and an error inside any SSE stream)."""
    fields = {"message": message, "type": type, "param": param, "code": status}
    return {"error": fields} if nested else {"object": "error", **fields}


# -- what the worker reports ----------------------------------------------------------------


@dataclass
class RequestProgress:
    """A request's state as of its latest committed step (cumulative)."""

    rid: str
    prompt_tokens: int
    speculative: bool
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: dict | None = None
    spec_verify_ct: int = 0
    spec_num_correct_drafts: int = 0
    spec_num_proposed_drafts: int = 0
    e2e_latency: float | None = None
    first_token_latency: float | None = None
    input_logprobs: TokenLogprobs | None = None  # with a LogprobRequest asking for prompt logprobs
    output_logprobs: TokenLogprobs | None = None  # with a LogprobRequest: one per output id

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def new_request_id() -> str:
    return uuid.uuid4().hex


def spec_details(progress: RequestProgress) -> dict[str, Any]:
    """SGLang's per-request speculative statistics (meta_info keys / SpecTokensDetails)."""
    verify = progress.spec_verify_ct
    proposed = progress.spec_num_proposed_drafts
    return {
        "spec_verify_ct": verify,
        "spec_accept_length": (progress.completion_tokens / verify) if verify else 0.0,
        "spec_accept_rate": (progress.spec_num_correct_drafts / proposed) if proposed else 0.0,
        "spec_num_correct_drafts": progress.spec_num_correct_drafts,
        "spec_num_proposed_drafts": proposed,
    }


class TokenTextSource(Protocol):
    """Token id -> its raw bytes and display text (tokenizer.TokenTexts)."""

    def raw(self, token_id: int) -> bytes: ...

    def text(self, token_id: int) -> str: ...


@dataclass
class LogprobView:
    """How a response shows a request's logprobs: `top` alternatives per position (0: none);
    `texts` fills the text of SGLang's (logprob, id, text) tuples (None: `return_text_in_logprobs`
    was not asked, the text is None as in SGLang)."""

    top: int = 0
    texts: TokenTextSource | None = None


def _triples(logprobs: TokenLogprobs, texts: TokenTextSource | None) -> list[list[Any]]:
    return [[lp, tid, texts.text(tid) if texts else None] for tid, lp in zip(logprobs.token_ids, logprobs.logprobs)]


def _top_triples(logprobs: TokenLogprobs, texts: TokenTextSource | None) -> list[Any]:
    return [None if row is None else [[lp, tid, texts.text(tid) if texts else None] for lp, tid in row]
            for row in (logprobs.top or [])]


def sglang_logprobs(progress: RequestProgress, view: LogprobView) -> dict[str, Any]:
    """meta_info's logprob keys, SGLang's shapes (tokenizer_manager.add_logprob_to_meta_info)."""
    inputs = progress.input_logprobs or TokenLogprobs()
    outputs = progress.output_logprobs or TokenLogprobs()
    meta: dict[str, Any] = {
        "input_token_logprobs": _triples(inputs, view.texts),
        "output_token_logprobs": _triples(outputs, view.texts),
        "output_token_logprobs_length": len(outputs.token_ids),
    }
    if view.top > 0:
        meta["input_top_logprobs"] = _top_triples(inputs, view.texts)
        meta["output_top_logprobs"] = _top_triples(outputs, view.texts)
    return meta


def completion_logprobs(parts: list[TokenLogprobs], texts: TokenTextSource, top: int, offset: int = 0) -> tuple[dict[str, Any], int]:
    """OpenAI's legacy `logprobs` object over `parts` (with echo: the prompt's, then the
    output's); returns it and the text offset after it (a stream continues from there)."""
    out: dict[str, Any] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for part in parts:
        for tid, lp in zip(part.token_ids, part.logprobs):
            token = texts.text(tid)
            out["tokens"].append(token)
            out["token_logprobs"].append(lp)
            out["text_offset"].append(offset)
            offset += len(token)
        if top > 0:
            out["top_logprobs"] += [None if row is None else {texts.text(tid): lp for lp, tid in row} for row in (part.top or [])]
    return out, offset


def chat_logprobs(part: TokenLogprobs, texts: TokenTextSource, top: int) -> dict[str, Any]:
    """OpenAI's chat `logprobs` object ({"content": [...]}) for the tokens of `part`."""
    def entry(tid: int, lp: float) -> dict[str, Any]:
        return {"token": texts.text(tid), "bytes": list(texts.raw(tid)), "logprob": lp}

    content = []
    for i, (tid, lp) in enumerate(zip(part.token_ids, part.logprobs)):
        item = entry(tid, lp)
        row = part.top[i] if part.top is not None and i < len(part.top) else None
        item["top_logprobs"] = [entry(t, v) for v, t in row[:top]] if top and row else []
        content.append(item)
    return {"content": content}


def slice_logprobs(logprobs: TokenLogprobs | None, start: int, end: int | None = None) -> TokenLogprobs:
    if logprobs is None:
        return TokenLogprobs()
    return TokenLogprobs(logprobs.token_ids[start:end], logprobs.logprobs[start:end],
                         None if logprobs.top is None else logprobs.top[start:end])


def meta_info(progress: RequestProgress, logprobs: LogprobView | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": progress.rid,
        "finish_reason": progress.finish_reason,
        "prompt_tokens": progress.prompt_tokens,
        "completion_tokens": progress.completion_tokens,
        "cached_tokens": 0,
    }
    if progress.finished and progress.e2e_latency is not None:
        meta["e2e_latency"] = progress.e2e_latency
    if progress.speculative:
        meta.update(spec_details(progress))
    if logprobs is not None:
        meta.update(sglang_logprobs(progress, logprobs))
    return meta


def generate_response(progress: RequestProgress, *, streaming: bool = False, logprobs: LogprobView | None = None) -> dict[str, Any]:
    """/generate's body, and each streamed chunk (cumulative text and counts, like SGLang).

    Streamed chunks carry `output_ids` only in the final one: resending the cumulative
    ids on every step is quadratic, and the JSON encoding would compete for the GIL
    with the engine thread of this same process."""
    body: dict[str, Any] = {"text": progress.text, "meta_info": meta_info(progress, logprobs)}
    if not streaming or progress.finished:
        body["output_ids"] = list(progress.output_ids)
    return body


def openai_finish_reason(finish: dict | None) -> str | None:
    if finish is None:
        return None
    kind = finish.get("type")
    if kind == "length":
        return "length"
    if kind == "abort":
        return "abort"
    return "stop"


def matched_stop(finish: dict | None) -> Any:
    if finish and finish.get("type") == "stop":
        return finish.get("matched")
    return None


def usage(progress: RequestProgress) -> dict[str, Any]:
    return {
        "prompt_tokens": progress.prompt_tokens,
        "completion_tokens": progress.completion_tokens,
        "total_tokens": progress.prompt_tokens + progress.completion_tokens,
        "prompt_tokens_details": None,
    }


def total_usage(results: list[RequestProgress], n: int) -> dict[str, Any]:
    """A response's usage over its choices (SGLang's UsageProcessor): each prompt's tokens once
    (its n samples share it), every choice's completion tokens."""
    prompt = sum(results[i].prompt_tokens for i in range(0, len(results), max(n, 1)))
    completion = sum(p.completion_tokens for p in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": None}


def sglext_of(results: list[RequestProgress], want_spec: bool, n: int) -> dict[str, Any] | None:
    """SGLang's response-level sglext: spec_tokens_details, a list of one per choice when n > 1."""
    details = [spec_details(p) for p in results if p.speculative] if want_spec else []
    if not details:
        return None
    return {"spec_tokens_details": details if n > 1 else details[0]}


def chat_tool_calls(calls: list[ToolCallItem]) -> list[dict[str, Any]]:
    """A reply's parsed calls as the message's tool_calls (SGLang's ToolCall: a fresh id each, the
    call's ordinal as its index, the arguments as JSON text)."""
    return [{"id": new_call_id(), "index": i, "type": "function", "function": {"name": c.name, "arguments": c.parameters}}
            for i, c in enumerate(calls)]


def tool_call_delta(item: ToolCallItem) -> dict[str, Any]:
    """One streamed piece of a call: its id and name with its first piece, then argument text."""
    return {"tool_calls": [{"id": new_call_id() if item.name else None, "index": item.tool_index, "type": "function",
                            "function": {"name": item.name, "arguments": item.parameters}}]}


def chat_finish_reason(finish: dict | None, called: bool) -> str | None:
    """SGLang turns a reply that stopped on its own after a parsed call into "tool_calls"."""
    reason = openai_finish_reason(finish)
    return "tool_calls" if called and reason == "stop" else reason


def chat_choice(progress: RequestProgress, index: int, *, logprobs: dict[str, Any] | None = None,
                tools: tuple[str, list[ToolCallItem]] | None = None) -> dict[str, Any]:
    """`tools`: (content, calls) as the tool-call parser read the reply (None: the text as it is)."""
    content, calls = tools if tools is not None else (progress.text, [])
    return {
        "index": index,
        "message": {"role": "assistant", "content": content, "reasoning_content": None,
                    "tool_calls": chat_tool_calls(calls) if calls else None},
        "logprobs": logprobs,
        "finish_reason": chat_finish_reason(progress.finish_reason, bool(calls)),
        "matched_stop": None if calls else matched_stop(progress.finish_reason),
    }


def chat_stream_choice(index: int, delta: dict[str, Any], finish: dict | None = None, *,
                       logprobs: dict[str, Any] | None = None, called: bool = False) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": chat_finish_reason(finish, called),
            "matched_stop": None if called else matched_stop(finish)}


def completion_choice(progress: RequestProgress, index: int, *, echo: str = "",
                      logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """`echo`: the prompt's text, put before the completion (OpenAI's echo)."""
    return {
        "index": index,
        "text": echo + progress.text,
        "logprobs": logprobs,
        "finish_reason": openai_finish_reason(progress.finish_reason),
        "matched_stop": matched_stop(progress.finish_reason),
    }


def completion_stream_choice(index: int, text: str, finish: dict | None = None, *,
                             logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": openai_finish_reason(finish),
            "matched_stop": matched_stop(finish)}


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"


def now_created() -> int:
    return int(time.time())


def ollama_timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def ollama_done_reason(progress: RequestProgress | None) -> str:
    """Ollama's done_reason: "length" when num_predict cut the reply (SGLang says "stop" always)."""
    finish = (progress.finish_reason or {}) if progress is not None else {}
    return "length" if finish.get("type") == "length" else "stop"


def ollama_timings(progress: RequestProgress | None, total_ns: int | None) -> dict[str, Any]:
    """The final line's counts and durations (nanoseconds), the figures Ollama front-ends show
    as tokens per second: the prompt's evaluation is the time to the first token, the output's
    the rest."""
    first = progress.first_token_latency if progress is not None else None
    e2e = progress.e2e_latency if progress is not None else None
    return {"total_duration": total_ns, "load_duration": 0 if progress is not None else None,
            "prompt_eval_count": progress.prompt_tokens if progress else None,
            "prompt_eval_duration": int(first * 1e9) if first is not None else None,
            "eval_count": progress.completion_tokens if progress else None,
            "eval_duration": int((e2e - first) * 1e9) if first is not None and e2e is not None else None}


def ollama_tool_calls(calls: list[ToolCallItem]) -> list[dict[str, Any]]:
    """Parsed calls in Ollama's shape: each function's arguments an object, not JSON text."""
    return [{"function": {"index": c.tool_index, "name": c.name, "arguments": json.loads(c.parameters)}} for c in calls]


def ollama_reply(kind: Literal["chat", "generate"], model: str, text: str, *, done: bool, whole: bool = False,
                 progress: RequestProgress | None = None, total_ns: int | None = None,
                 calls: list[ToolCallItem] | None = None) -> dict[str, Any]:
    """An /api/chat or /api/generate body or stream line, SGLang's fields (pydantic's dump of its
    Ollama*Response models: every field, None included); the last line of a stream (done) carries
    the counts and durations too, as Ollama's does. `calls`: the tool calls read from the reply,
    in the message as Ollama puts them."""
    body: dict[str, Any] = {"model": model, "created_at": ollama_timestamp()}
    if kind == "chat":
        body["message"] = {"role": "assistant", "content": text, "images": None}
        if calls:
            body["message"]["tool_calls"] = ollama_tool_calls(calls)
    else:
        body["response"] = text
    body["done"] = done
    body["done_reason"] = ollama_done_reason(progress) if done else None
    if whole and kind == "generate":  # a non-streamed reply
        body["context"] = None
    if whole or (done and progress is not None):
        body.update(ollama_timings(progress, total_ns))
    return body
