"""Async HTTP client for the SGLang-compatible API (SGLang itself or the embedded engine).

The only module (with tui/) that touches the network. It returns plain data and
timings taken on arrival of each chunk, so that metrics (TTFT, TPOT, ITL, accept
length) can be computed exactly as sglang.bench_serving defines them
(see sparkit.bench.metrics).

SGLang's native `/generate` stream sends *cumulative* `text` and cumulative
`meta_info.completion_tokens` in each `data:` line; the client turns them into
deltas. `/v1/chat/completions` streams OpenAI deltas.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from sparkit.errors import EngineError


@dataclass
class StreamChunk:
    """One streamed piece of output, stamped with time.perf_counter() on arrival."""

    t: float
    text: str  # the new text only (delta)
    new_tokens: int  # how many tokens this chunk carries (speculative chunks carry several)
    completion_tokens: int  # cumulative
    meta: dict[str, Any] = field(default_factory=dict)  # last meta_info (native) or {} (chat)


@dataclass
class Generation:
    """A finished request, streamed or not, with client-side timings (seconds)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: Any
    t_start: float
    t_first_token: float | None
    t_end: float
    chunks: list[StreamChunk] = field(default_factory=list)
    spec_verify_ct: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    output_ids: list[int] | None = None  # token ids, when the server returns them (non-streamed /generate)

    @property
    def ttft(self) -> float | None:
        return None if self.t_first_token is None else self.t_first_token - self.t_start

    @property
    def latency(self) -> float:
        return self.t_end - self.t_start

    @property
    def accept_length(self) -> float | None:
        """Tokens committed per verify step (completion_tokens / spec_verify_ct)."""
        if self.spec_verify_ct:
            return self.completion_tokens / self.spec_verify_ct
        value = self.meta.get("spec_accept_length")
        return float(value) if value is not None else None

    @property
    def decode_tok_s(self) -> float | None:
        """Decode speed excluding TTFT: (completion_tokens - 1) / (latency - ttft)."""
        if self.t_first_token is None or self.completion_tokens < 2:
            return None
        span = self.t_end - self.t_first_token
        return (self.completion_tokens - 1) / span if span > 0 else None


def _raise_for(response: httpx.Response, what: str) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
        message = (
            body.get("error", {}).get("message")
            if isinstance(body.get("error"), dict)
            else body.get("error") or body.get("message") or body.get("detail")
        )
    except Exception:
        message = response.text[:500]
    raise EngineError(f"{what}: HTTP {response.status_code}: {message}")


NO_SERVER_HINT = "is the server running? `sparkit status` lists the ones sparkit started; check the URL and port"


def no_server_answered(base_url: str) -> EngineError:
    """Nothing accepted the connection: the server never answered (it did not go away)."""
    return EngineError(f"no server answered at {base_url}", hint=NO_SERVER_HINT)


def _unreachable(exc: httpx.HTTPError, base_url: str, message: str) -> EngineError:
    # A refused or timed-out connect means nothing is there; any later failure means a
    # server was there and the exchange broke.
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return no_server_answered(base_url)
    return EngineError(f"{message}: {exc}")


async def _sse_lines(response: httpx.Response) -> AsyncIterator[Any]:
    """Yield decoded JSON payloads of `data:` lines until `data: [DONE]`."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        if payload:
            yield json.loads(payload)


def auth_headers(api_key: str | None) -> dict[str, str]:
    """How every sparkit request carries a server's API key (SGLang's and the embedded engine's
    `Authorization: Bearer`)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def check_health(base_url: str, *, api_key: str | None = None, timeout: float = 3.0,
                 transport: httpx.BaseTransport | None = None) -> bool:
    """True when GET /health answers 200 (blocking; for code outside an event loop, such as a
    launcher waiting for its server)."""
    try:
        with httpx.Client(base_url=base_url.rstrip("/"), headers=auth_headers(api_key),
                          timeout=httpx.Timeout(timeout, connect=min(timeout, 1.0)), transport=transport) as http:
            return http.get("/health").status_code == 200
    except httpx.HTTPError:
        return False


class EngineClient:
    """Client for one server. Use as `async with EngineClient(url) as c: ...`.

    `transport` is httpx's seam: `httpx.ASGITransport(app)` serves the requests from an ASGI app
    in this process (the embedded server's routes, in tests), with nothing else changed."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 600.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=auth_headers(api_key),
            timeout=httpx.Timeout(timeout, connect=5.0),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            transport=transport,
        )

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- plain GETs -------------------------------------------------------------------
    async def _get_json(self, path: str, fallback: str | None = None) -> Any:
        try:
            response = await self._http.get(path)
            if response.status_code == 404 and fallback:
                response = await self._http.get(fallback)
        except httpx.HTTPError as exc:
            raise _unreachable(exc, self.base_url, f"cannot reach {self.base_url}{path}") from exc
        _raise_for(response, f"GET {path}")
        return response.json()

    async def health(self) -> bool:
        """True once /health answers 200 (503 while the engine starts)."""
        try:
            response = await self._http.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def server_info(self) -> dict[str, Any]:
        return await self._get_json("/server_info", fallback="/get_server_info")

    async def model_info(self) -> dict[str, Any]:
        return await self._get_json("/model_info", fallback="/get_model_info")

    async def models(self) -> list[str]:
        data = await self._get_json("/v1/models")
        return [m["id"] for m in data.get("data", [])]

    async def metrics(self) -> dict[str, float]:
        """Prometheus text parsed to {'name{labels}': value}; also '{name}' summed without labels."""
        try:
            response = await self._http.get("/metrics")
        except httpx.HTTPError as exc:
            raise _unreachable(exc, self.base_url, f"cannot reach {self.base_url}/metrics") from exc
        _raise_for(response, "GET /metrics")
        return parse_prometheus(response.text)

    # -- the profiler (SGLang's /start_profile, /stop_profile) ---------------------------
    async def start_profile(self, request: dict[str, Any]) -> str | None:
        """POST /start_profile with SGLang's ProfileReq fields (output_dir, num_steps, activities,
        with_stack, record_shapes, profile_id). Returns the directory the server says it writes
        the trace to (sparkit's embedded engine chooses its own: x-sparkit-profile-dir), or None
        (SGLang writes to output_dir). EngineError when the server has no profiler."""
        try:
            response = await self._http.post("/start_profile", json=request)
        except httpx.HTTPError as exc:
            raise _unreachable(exc, self.base_url, f"POST /start_profile to {self.base_url} failed") from exc
        if response.status_code == 404:
            raise EngineError(f"{self.base_url} has no /start_profile: this server cannot profile its forward passes",
                              hint="SGLang and sparkit's embedded engine have it")
        _raise_for(response, "POST /start_profile")
        where = response.headers.get("x-sparkit-profile-dir")
        return os.fsdecode(urllib.parse.unquote_to_bytes(where)) if where else None  # the server percent-encodes it

    async def stop_profile(self) -> None:
        try:
            response = await self._http.post("/stop_profile", timeout=180.0)
        except httpx.HTTPError as exc:
            raise _unreachable(exc, self.base_url, f"POST /stop_profile to {self.base_url} failed") from exc
        _raise_for(response, "POST /stop_profile")

    # -- native /generate -------------------------------------------------------------
    def _generate_body(
        self,
        text: str | None,
        input_ids: list[int] | None,
        sampling_params: dict[str, Any] | None,
        stream: bool,
        extra: dict[str, Any] | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"sampling_params": sampling_params or {}, "stream": stream}
        if input_ids is not None:
            body["input_ids"] = input_ids
        else:
            body["text"] = text or ""
        if extra:
            body.update(extra)
        return body

    async def generate(
        self,
        text: str | None = None,
        *,
        input_ids: list[int] | None = None,
        sampling_params: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Generation:
        """Non-streamed /generate. TTFT is unknown (None)."""
        body = self._generate_body(text, input_ids, sampling_params, False, extra)
        t0 = time.perf_counter()
        try:
            response = await self._http.post("/generate", json=body)
        except httpx.HTTPError as exc:
            raise _unreachable(exc, self.base_url, f"POST /generate to {self.base_url} failed") from exc
        _raise_for(response, "POST /generate")
        t1 = time.perf_counter()
        data = response.json()
        if isinstance(data, list):  # batch form; we only send one
            data = data[0]
        meta = data.get("meta_info", {})
        return Generation(
            text=data.get("text", ""),
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            completion_tokens=int(meta.get("completion_tokens", 0)),
            finish_reason=meta.get("finish_reason"),
            t_start=t0,
            t_first_token=None,
            t_end=t1,
            spec_verify_ct=meta.get("spec_verify_ct"),
            meta=meta,
            output_ids=data.get("output_ids"),
        )

    async def stream_generate(
        self,
        text: str | None = None,
        *,
        input_ids: list[int] | None = None,
        sampling_params: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> AsyncIterator[StreamChunk | Generation]:
        """Yield StreamChunk as they arrive, then one final Generation.

        Closing the iterator early (break / aclose) closes the HTTP stream, which
        makes the server abort the request and free its slot.
        """
        body = self._generate_body(text, input_ids, sampling_params, True, extra)
        t0 = time.perf_counter()
        chunks: list[StreamChunk] = []
        full_text = ""
        completion = 0
        meta: dict[str, Any] = {}
        first: float | None = None
        try:
            async with self._http.stream("POST", "/generate", json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _raise_for(response, "POST /generate")
                async for data in _sse_lines(response):
                    now = time.perf_counter()
                    if "error" in data and "meta_info" not in data:
                        err = data["error"]
                        raise EngineError(f"/generate stream error: {err.get('message', err) if isinstance(err, dict) else err}")
                    meta = data.get("meta_info", meta)
                    new_text = data.get("text", full_text)
                    delta = new_text[len(full_text):] if new_text.startswith(full_text) else new_text
                    full_text = new_text
                    new_completion = int(meta.get("completion_tokens", completion))
                    n_new = max(0, new_completion - completion)
                    completion = new_completion
                    if n_new == 0 and not delta:
                        continue
                    if first is None:
                        first = now
                    chunk = StreamChunk(t=now, text=delta, new_tokens=n_new, completion_tokens=completion, meta=meta)
                    chunks.append(chunk)
                    yield chunk
        except httpx.HTTPError as exc:
            raise _unreachable(exc, self.base_url, f"stream from {self.base_url}/generate broke off") from exc
        yield Generation(
            text=full_text,
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            completion_tokens=completion,
            finish_reason=meta.get("finish_reason"),
            t_start=t0,
            t_first_token=first,
            t_end=time.perf_counter(),
            chunks=chunks,
            spec_verify_ct=meta.get("spec_verify_ct"),
            meta=meta,
        )

    # -- OpenAI chat --------------------------------------------------------------------
    async def stream_chat(
        self,
        messages: list[dict[str, str]],
        *,
        model: str | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        max_tokens: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> AsyncIterator[StreamChunk | Generation]:
        """Stream /v1/chat/completions; yields StreamChunk then a final Generation.

        Asks for usage (stream_options.include_usage) and SGLang's per-request
        speculative details (return_spec_tokens_details) so that accept length is
        known per reply when the server speculates.
        """
        body = _chat_stream_body(messages, model, extra, temperature=temperature, top_p=top_p, top_k=top_k,
                                 max_tokens=max_tokens)
        t0 = time.perf_counter()
        chunks: list[StreamChunk] = []
        parts: list[str] = []
        first: float | None = None
        usage: dict[str, Any] = {}
        finish: Any = None
        sglext: dict[str, Any] = {}
        try:
            async with self._http.stream("POST", "/v1/chat/completions", json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _raise_for(response, "POST /v1/chat/completions")
                async for data in _sse_lines(response):
                    now = time.perf_counter()
                    if "error" in data and not data.get("choices"):
                        err = data["error"]
                        raise EngineError(f"chat stream error: {err.get('message', err) if isinstance(err, dict) else err}")
                    if data.get("usage"):
                        usage = data["usage"]
                    if data.get("sglext"):
                        sglext = data["sglext"]
                    for choice in data.get("choices") or []:
                        if choice.get("finish_reason"):
                            finish = choice["finish_reason"]
                        delta = (choice.get("delta") or {}).get("content") or ""
                        if not delta:
                            continue
                        if first is None:
                            first = now
                        parts.append(delta)
                        chunk = _stream_chunk(data, delta, now, chunks[-1].completion_tokens if chunks else 0)
                        chunks.append(chunk)
                        yield chunk
        except httpx.HTTPError as exc:
            raise _unreachable(exc, self.base_url, f"stream from {self.base_url}/v1/chat/completions broke off") from exc
        details = sglext.get("spec_tokens_details") or {}
        completion = int(usage.get("completion_tokens", len(parts)))
        yield Generation(
            text="".join(parts),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=completion,
            finish_reason=finish,
            t_start=t0,
            t_first_token=first,
            t_end=time.perf_counter(),
            chunks=chunks,
            spec_verify_ct=details.get("spec_verify_ct"),
            meta={"usage": usage, "sglext": sglext},
        )


def _chat_stream_body(messages: list[dict[str, str]], model: str | None, extra: dict[str, Any] | None,
                      **sampling: Any) -> dict[str, Any]:
    """A streamed chat request asking for usage and SGLang's speculative details; sampling
    settings that are None are left to the server."""
    body: dict[str, Any] = {
        "model": model or "default",
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_spec_tokens_details": True,
    }
    for key, value in sampling.items():
        if value is not None:
            body[key] = value
    if extra:
        body.update(extra)
    return body


def _stream_chunk(data: dict[str, Any], delta: str, now: float, counted: int) -> StreamChunk:
    """The chunk of a stream event carrying `delta`, `counted` tokens having come before it."""
    # With stream_options.continuous_usage_stats SGLang puts the cumulative usage on
    # every chunk: a speculative chunk then counts all the tokens it carries.
    running = (data.get("usage") or {}).get("completion_tokens")
    if isinstance(running, int) and running > counted:
        new_tokens, cumulative = running - counted, running
    else:
        new_tokens, cumulative = 1, counted + 1
    return StreamChunk(t=now, text=delta, new_tokens=new_tokens, completion_tokens=cumulative,
                       meta={"usage": data["usage"]} if isinstance(running, int) else {})


def parse_prometheus(text: str) -> dict[str, float]:
    """Parse Prometheus exposition text. Keys are 'name{labels}' as written; each metric
    name also gets an unlabelled key holding the sum over its label sets."""
    values: dict[str, float] = {}
    sums: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            key, raw = line.rsplit(" ", 1)
            value = float(raw)
        except ValueError:
            continue
        values[key] = value
        name = key.split("{", 1)[0]
        if name != key:
            sums[name] = sums.get(name, 0.0) + value
    for name, total in sums.items():
        values.setdefault(name, total)
    return values
