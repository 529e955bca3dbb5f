"""Request parsing and response shaping for the embedded server's SGLang/OpenAI HTTP API.

Pure data in, data out: no HTTP framework, no torch. server.py owns the sockets;
this module decides what a valid request is and what each response looks like,
so that it can be unit-tested without starting anything.

Request bodies are user input, hence pydantic models with `extra="forbid"`: a
misspelled field is a 400 naming the field, not a silently ignored knob.
Sampling features the embedded engine does not implement (n > 1, logprobs,
penalties) are accepted only at their neutral value and otherwise rejected with a
message saying so, rather than ignored.

Shapes follow sglang 0.5.23 (sglang/srt/entrypoints/openai/protocol.py and
serving_chat.py): `meta_info` keys, `sglext.spec_tokens_details`, the extra
usage / sglext chunks that close a stream, and `data: [DONE]`.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# /generate's default when sampling_params.max_new_tokens is absent (SGLang's default).
DEFAULT_GENERATE_MAX_NEW_TOKENS = 128
# OpenAI's /v1/completions default for max_tokens.
DEFAULT_COMPLETION_MAX_TOKENS = 16


class ApiError(Exception):
    """A request the server refuses: becomes `{"error": {...}}` with `status`."""

    def __init__(self, status: int, message: str, *, type: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, type=self.type, param=self.param)


def error_body(status: int, message: str, *, type: str = "BadRequestError", param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape (the `openai` client raises its typed errors from it);
    SGLang answers /v1 errors the same way, and the embedded server uses it everywhere."""
    return {"error": {"message": message, "type": type, "param": param, "code": status}}


# -- request models -----------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _neutral(value: float | int | None, neutral: float | int, name: str) -> None:
    if value is not None and value != neutral:
        raise ValueError(f"{name}={value} is not supported by the embedded engine (only {neutral})")


class _SamplingMixin(_Strict):
    temperature: float | None = Field(None, ge=0.0, description="0 = greedy")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None
    min_p: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    n: int | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and value < 1:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return value

    @model_validator(mode="after")
    def _unsupported(self):
        _neutral(self.min_p, 0.0, "min_p")
        _neutral(self.frequency_penalty, 0.0, "frequency_penalty")
        _neutral(self.presence_penalty, 0.0, "presence_penalty")
        _neutral(self.repetition_penalty, 1.0, "repetition_penalty")
        _neutral(self.n, 1, "n")
        return self

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return [s for s in stops if s]


class GenerateSamplingParams(_SamplingMixin):
    max_new_tokens: int | None = Field(None, ge=0)
    min_new_tokens: int | None = None
    sampling_seed: int | None = None

    @model_validator(mode="after")
    def _min_new(self):
        _neutral(self.min_new_tokens, 0, "min_new_tokens")
        return self


class GenerateRequest(_Strict):
    """SGLang's native /generate body (single request; batches are refused)."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: GenerateSamplingParams = Field(default_factory=GenerateSamplingParams)
    stream: bool = False
    rid: str | None = None
    return_logprob: bool = False

    @model_validator(mode="after")
    def _one_prompt(self):
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of `text` or `input_ids`")
        if self.return_logprob:
            raise ValueError("return_logprob is not supported by the embedded engine")
        return self


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _OpenAIMixin(_SamplingMixin):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    user: str | None = None
    rid: str | None = None
    return_spec_tokens_details: bool = False

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_OpenAIMixin):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    separate_reasoning: bool = True

    @model_validator(mode="after")
    def _no_logprobs(self):
        if self.logprobs or self.top_logprobs:
            raise ValueError("logprobs are not supported by the embedded engine")
        return self

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_OpenAIMixin):
    prompt: str | list[int] | list[str]
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _single(self):
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise ValueError("batched prompts are not supported by the embedded engine (send one prompt per request)")
        if self.logprobs:
            raise ValueError("logprobs are not supported by the embedded engine")
        if self.echo or self.suffix:
            raise ValueError("echo and suffix are not supported by the embedded engine")
        _neutral(self.best_of, 1, "best_of")
        return self

    def prompt_text_or_ids(self) -> str | list[int]:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            return self.prompt[0]
        return self.prompt  # type: ignore[return-value]


def parse_body(raw: bytes, model: type[BaseModel], where: str) -> Any:
    """JSON bytes -> a validated request model, or ApiError(400) naming the offending field."""
    if isinstance(raw, (bytes, bytearray)) and not raw.strip():
        raise ApiError(400, f"{where}: empty request body; send a JSON object")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"{where}: malformed JSON: {exc}") from None
    if isinstance(data, list):
        raise ApiError(400, f"{where}: batched requests are not supported by the embedded engine; send one JSON object per request")
    if not isinstance(data, dict):
        raise ApiError(400, f"{where}: the body must be a JSON object, got {type(data).__name__}")
    if model is GenerateRequest and isinstance(data.get("text"), list):
        raise ApiError(400, f"{where}: batched requests are not supported by the embedded engine; send one prompt per request")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(400, f"{where}: {describe_validation_error(exc, model)}", param=_first_loc(exc)) from None


def _first_loc(exc: ValidationError) -> str | None:
    errors = exc.errors()
    return ".".join(str(p) for p in errors[0]["loc"]) if errors and errors[0]["loc"] else None


def describe_validation_error(exc: ValidationError, model: type[BaseModel]) -> str:
    """One line per problem: 'sampling_params.max_new_tokens: Input should be greater than or equal to 0'."""
    lines = []
    seen: set[str] = set()
    for err in exc.errors():
        loc_parts = [str(p) for p in err["loc"]]
        # Union members add their type name to the location; drop it for readability.
        loc_parts = [p for p in loc_parts if p not in {"str", "list[str]", "list[int]", "list[TextPart]", "function-after[_single(), CompletionRequest]"}]
        loc = ".".join(loc_parts)
        if err["type"] == "extra_forbidden":
            message = "unknown field"
            allowed = _allowed_fields(model, loc_parts[:-1])
            if allowed:
                message += f" (allowed: {', '.join(allowed)})"
        else:
            message = err["msg"].removeprefix("Value error, ")
        line = f"{loc}: {message}" if loc else message
        if line not in seen:
            seen.add(line)
            lines.append(line)
    return "; ".join(lines)


def _allowed_fields(model: type[BaseModel], parents: list[str]) -> list[str]:
    current: Any = model
    for name in parents:
        info = getattr(current, "model_fields", {}).get(name)
        if info is None:
            return []
        annotation = info.annotation
        current = next((a for a in getattr(annotation, "__args__", (annotation,)) if hasattr(a, "model_fields")), annotation)
        if not hasattr(current, "model_fields"):
            return []
    return sorted(getattr(current, "model_fields", {}))


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


def meta_info(progress: RequestProgress) -> dict[str, Any]:
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
    return meta


def generate_response(progress: RequestProgress, *, streaming: bool = False) -> dict[str, Any]:
    """/generate's body, and each streamed chunk (cumulative text and counts, like SGLang).

    Streamed chunks carry `output_ids` only in the final one: resending the cumulative
    ids on every step is quadratic, and the JSON encoding would compete for the GIL
    with the engine thread of this same process."""
    body: dict[str, Any] = {"text": progress.text, "meta_info": meta_info(progress)}
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


def sglext(progress: RequestProgress, want_spec: bool) -> dict[str, Any] | None:
    if want_spec and progress.speculative:
        return {"spec_tokens_details": spec_details(progress)}
    return None


def chat_completion(progress: RequestProgress, model: str, created: int, want_spec: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": progress.rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": progress.text, "reasoning_content": None, "tool_calls": None},
                "logprobs": None,
                "finish_reason": openai_finish_reason(progress.finish_reason),
                "matched_stop": matched_stop(progress.finish_reason),
            }
        ],
        "usage": usage(progress),
    }
    ext = sglext(progress, want_spec)
    if ext:
        body["sglext"] = ext
    return body


def chat_chunk(rid: str, model: str, created: int, delta: dict[str, Any], finish: dict | None = None) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": openai_finish_reason(finish),
                "matched_stop": matched_stop(finish),
            }
        ],
    }


def completion(progress: RequestProgress, model: str, created: int, want_spec: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": progress.rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": progress.text,
                "logprobs": None,
                "finish_reason": openai_finish_reason(progress.finish_reason),
                "matched_stop": matched_stop(progress.finish_reason),
            }
        ],
        "usage": usage(progress),
    }
    ext = sglext(progress, want_spec)
    if ext:
        body["sglext"] = ext
    return body


def completion_chunk(rid: str, model: str, created: int, text: str, finish: dict | None = None) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": openai_finish_reason(finish),
                "matched_stop": matched_stop(finish),
            }
        ],
    }


def closing_chunks(kind: Literal["chat", "completion"], progress: RequestProgress, model: str, created: int, *, include_usage: bool, want_spec: bool) -> list[dict[str, Any]]:
    """The choice-less chunks SGLang sends after the finish chunk: sglext, then usage."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    chunks = []
    ext = sglext(progress, want_spec)
    if ext:
        chunks.append({"id": progress.rid, "object": obj, "created": created, "model": model, "choices": [], "sglext": ext})
    if include_usage:
        chunks.append({"id": progress.rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage(progress)})
    return chunks


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"


def now_created() -> int:
    return int(time.time())


# -- text helpers used by the worker ------------------------------------------------------------


def stable_text(text: str, finished: bool) -> str:
    """Text safe to show while streaming: a byte-level tokenizer decodes a half-received
    UTF-8 character as U+FFFD; hold it back until the next token completes it."""
    if finished:
        return text
    return text.rstrip("\ufffd")


def find_stop(text: str, stops: list[str], search_from: int = 0) -> tuple[int, str] | None:
    """Earliest occurrence of any stop string starting at or after `search_from`
    (callers pass len(previous text) - longest stop + 1, so a stop spanning two steps is found)."""
    best: tuple[int, str] | None = None
    for stop in stops:
        pos = text.find(stop, max(0, search_from))
        if pos != -1 and (best is None or pos < best[0]):
            best = (pos, stop)
    return best
