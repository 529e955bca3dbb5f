"""The HTTP surface: the state the routes share, the Starlette app and its handlers, bearer auth.
Request parsing and response shapes are protocol.py's; this module binds them to HTTP."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from sparkit.engines.embedded import protocol as proto
from sparkit.engines.embedded.api import SamplingParams
from sparkit.engines.embedded.metrics import ServerMetrics
from sparkit.engines.embedded.settings import API_KEY_ENV, engine_config, redacted_argv
from sparkit.engines.embedded.worker import EngineWorker, Job

# -- HTTP -----------------------------------------------------------------------------------------------


class ServerState:
    """Everything the routes need; built once in main()."""

    def __init__(self, args: argparse.Namespace, argv: list[str], model_config: dict) -> None:
        self.args = args
        self.argv = argv
        self.model_config = model_config
        self.model_path = Path(args.model_path)
        self.served_name = args.served_model_name or self.model_path.name
        self.config = engine_config(args, self.served_name)
        self.api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
        self.speculative = self.config.speculative
        self.started_at = time.time()
        self.metrics = ServerMetrics(
            self.speculative,
            args.context_length or model_config.get("max_position_embeddings"),
            self.config.speculative_num_steps if self.speculative else None,
            self.config.num_draft_tokens if self.speculative else None,
        )
        self.worker: EngineWorker | None = None
        self.uvicorn_server: Any = None
        self.exit_code = 0
        self.vocab_size = int(model_config.get("vocab_size") or 0)

    # -- resolved facts, available once the engine loaded
    @property
    def engine(self) -> Any:
        return self.worker.engine if self.worker else None

    @property
    def context_length(self) -> int:
        engine = self.engine
        value = getattr(engine, "context_length", None) if engine is not None else None
        return int(value or self.args.context_length or self.model_config.get("max_position_embeddings") or 0)

    def server_args(self) -> dict[str, Any]:
        """SGLang's resolved args: the settings' (sparkit.engines.embedded.settings), the server's
        own, then what the loaded engine resolved (device, dtype, context length)."""
        a = self.args
        resolved: dict[str, Any] = {
            **self.config.resolved(),
            "served_model_name": self.served_name,
            "host": a.host,
            "port": a.port,
            "device": a.device,
            "dtype": a.dtype,
            "context_length": a.context_length,
            "enable_metrics": True,
            "max_queued_requests": a.max_queued_requests,
            "api_key": "<redacted>" if self.api_key else None,
            "max_running_requests": 1,
        }
        if self.engine is not None:
            resolved.update(self.engine.server_args())
        return resolved

    def launch_command(self) -> str:
        return shlex.join([sys.executable, "-m", "sparkit.engines.embedded", *redacted_argv(self.argv)])

    def accepts_model(self, name: str | None) -> bool:
        return name in (None, "", "default", self.served_name, str(self.args.model_path), self.model_path.name)


def _state(request: Request) -> ServerState:
    return request.app.state.sparkit


def error(exc: proto.ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)

def require_ready(state: ServerState) -> EngineWorker:
    worker = state.worker
    if worker is None or not worker.ready:
        raise proto.ApiError(503, "the engine is starting; retry when /health answers 200", type="ServiceUnavailableError")
    return worker

class JobStream(StreamingResponse):
    """Sets the job's cancel flag however the response ends (client gone included)."""

    def __init__(self, content, job: Job) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel.set()

def new_job(ids: list[int], params: SamplingParams, stops: list[str], *, no_stop_trim: bool, skip_special: bool, stream: bool, rid: str | None, internal: bool = False) -> Job:
    return Job(
        rid=rid or proto.new_request_id(),
        input_ids=ids,
        params=params,
        stops=stops,
        no_stop_trim=no_stop_trim,
        skip_special_tokens=skip_special,
        stream=stream,
        loop=asyncio.get_running_loop(),
        updates=asyncio.Queue(),
        internal=internal,
    )

async def updates(job: Job):
    """Yield the job's progress snapshots until it finishes; errors are raised.

    Snapshots are cumulative, so when the client reads slower than the engine
    commits, the ones waiting are coalesced into the newest: fewer, larger chunks
    instead of a backlog (and less work competing with the engine thread)."""
    try:
        while True:
            item = await job.updates.get()
            while not isinstance(item, BaseException) and not item.finished and not job.updates.empty():
                item = job.updates.get_nowait()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finished:
                return
    finally:
        job.cancel.set()

async def run_to_end(state: ServerState, job: Job, request: Request) -> proto.RequestProgress:
    """Non-streamed: wait for the end, watching for the client leaving meanwhile."""
    require_ready(state).submit(job)
    try:
        last_check = time.monotonic()
        while True:
            try:
                item = await asyncio.wait_for(job.updates.get(), timeout=0.25)
            except asyncio.TimeoutError:
                item = None
            if isinstance(item, BaseException):
                raise item
            if item is not None and item.finished:
                return item
            if time.monotonic() - last_check >= 0.25:
                last_check = time.monotonic()
                if await request.is_disconnected():
                    raise proto.ApiError(499, "client disconnected", type="ClientClosedRequest")
    finally:
        job.cancel.set()

def check_prompt(state: ServerState, ids: list[int], requested_max: int | None, default_max: int | None) -> int:
    """Validate prompt length against the context; returns max_new_tokens to use."""
    context = state.context_length
    if not ids:
        raise proto.ApiError(400, "the prompt is empty (0 tokens)")
    if state.vocab_size and any((not isinstance(i, int)) or i < 0 or i >= state.vocab_size for i in ids):
        raise proto.ApiError(400, f"input_ids: every id must be an integer in [0, {state.vocab_size})")
    if context and len(ids) >= context:
        raise proto.ApiError(
            400,
            f"The input ({len(ids)} tokens) is longer than the model's context length ({context} tokens).",
        )
    room = context - len(ids) if context else None
    if requested_max is not None:
        if room is not None and requested_max > room:
            raise proto.ApiError(
                400,
                f"Requested token count exceeds the model's maximum context length of {context} tokens. "
                f"You requested a total of {len(ids) + requested_max} tokens: {len(ids)} tokens from the input "
                f"and {requested_max} tokens for the completion. Reduce the prompt or max_new_tokens/max_tokens.",
            )
        return requested_max
    if default_max is None:
        return room if room is not None else proto.DEFAULT_GENERATE_MAX_NEW_TOKENS
    return min(default_max, room) if room is not None else default_max

def sampling(req: proto._SamplingMixin, max_new_tokens: int, seed: int | None) -> SamplingParams:
    return SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=-1 if req.top_k is None else req.top_k,
        max_new_tokens=max_new_tokens,
        stop=req.stop_list(),
        stop_token_ids=list(req.stop_token_ids or []),
        ignore_eos=req.ignore_eos,
        seed=seed,
    )

# -- routes (one function per endpoint, as SGLang's serving_* files; the shared state is the app's)

async def health(request: Request) -> Response:
    state = _state(request)
    worker = state.worker
    if worker is not None and worker.ready:
        return Response(status_code=200)
    return Response(status_code=503)

async def health_generate(request: Request) -> Response:
    state = _state(request)
    worker = state.worker
    if worker is None or not worker.ready:
        return Response(status_code=503)
    ids = worker.engine.tokenizer.encode("ping", add_special_tokens=False)
    job = new_job(ids, SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True), [], no_stop_trim=False, skip_special=True, stream=False, rid=None, internal=True)
    try:
        await run_to_end(state, job, request)
    except proto.ApiError:
        return Response(status_code=503)
    return Response(status_code=200)

async def generate(request: Request) -> Response:
    state = _state(request)
    req: proto.GenerateRequest = proto.parse_body(await request.body(), proto.GenerateRequest, "/generate")
    worker = require_ready(state)
    sp = req.sampling_params
    if req.input_ids is not None:
        ids = list(req.input_ids)
    else:
        ids = worker.engine.tokenizer.encode(req.text, add_special_tokens=False)
    max_new = check_prompt(state, ids, sp.max_new_tokens, proto.DEFAULT_GENERATE_MAX_NEW_TOKENS)
    job = new_job(ids, sampling(sp, max_new, sp.sampling_seed), sp.stop_list(), no_stop_trim=sp.no_stop_trim, skip_special=sp.skip_special_tokens, stream=req.stream, rid=req.rid)
    if not req.stream:
        return JSONResponse(proto.generate_response(await run_to_end(state, job, request)))
    worker.submit(job)

    async def body():
        try:
            async for progress in updates(job):
                yield proto.sse(proto.generate_response(progress, streaming=True))
        except proto.ApiError as exc:
            yield proto.sse(exc.body())
        yield proto.SSE_DONE

    return JobStream(body(), job)

def check_model(state: ServerState, name: str | None) -> None:
    if not state.accepts_model(name):
        raise proto.ApiError(404, f"The model `{name}` does not exist; this server serves `{state.served_name}`.", type="NotFoundError", param="model")

async def chat_completions(request: Request) -> Response:
    state = _state(request)
    req: proto.ChatCompletionRequest = proto.parse_body(await request.body(), proto.ChatCompletionRequest, "/v1/chat/completions")
    check_model(state, req.model)
    worker = require_ready(state)
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in req.messages]
    try:
        prompt = worker.engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **(req.chat_template_kwargs or {}))
    except Exception as exc:  # noqa: BLE001 - a template error is the request's fault
        raise proto.ApiError(400, f"messages: the chat template failed: {exc}") from None
    ids = worker.engine.tokenizer.encode(prompt, add_special_tokens=False)
    max_new = check_prompt(state, ids, req.requested_max_tokens(), None)
    return await openai_response(state, "chat", req, ids, max_new, request)

async def completions(request: Request) -> Response:
    state = _state(request)
    req: proto.CompletionRequest = proto.parse_body(await request.body(), proto.CompletionRequest, "/v1/completions")
    check_model(state, req.model)
    worker = require_ready(state)
    prompt = req.prompt_text_or_ids()
    ids = list(prompt) if isinstance(prompt, list) else worker.engine.tokenizer.encode(prompt, add_special_tokens=False)
    max_new = check_prompt(state, ids, req.max_tokens, proto.DEFAULT_COMPLETION_MAX_TOKENS)
    return await openai_response(state, "completion", req, ids, max_new, request)

async def openai_response(state: ServerState, kind: str, req: Any, ids: list[int], max_new: int, request: Request) -> Response:
    model = state.served_name
    created = proto.now_created()
    job = new_job(ids, sampling(req, max_new, req.seed), req.stop_list(), no_stop_trim=req.no_stop_trim, skip_special=req.skip_special_tokens, stream=req.stream, rid=req.rid)
    if kind == "chat":
        job.rid = "chatcmpl-" + job.rid if not req.rid else job.rid
    else:
        job.rid = "cmpl-" + job.rid if not req.rid else job.rid
    if not req.stream:
        progress = await run_to_end(state, job, request)
        shape = proto.chat_completion if kind == "chat" else proto.completion
        return JSONResponse(shape(progress, model, created, req.return_spec_tokens_details))
    require_ready(state).submit(job)

    # stream_options.continuous_usage_stats: SGLang puts the cumulative usage on every
    # chunk, which is how a client counts the several tokens of a speculative chunk.
    continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)

    def content(progress: Any, delta: str | None, finish: Any) -> bytes:
        chunk = _content_chunk(kind, job.rid, model, created, delta, finish)
        if continuous:
            chunk["usage"] = proto.usage(progress)
        return proto.sse(chunk)

    async def body():
        sent = ""
        try:
            if kind == "chat":
                yield proto.sse(proto.chat_chunk(job.rid, model, created, {"role": "assistant", "content": ""}))
            async for progress in updates(job):
                delta = progress.text[len(sent):] if progress.text.startswith(sent) else ""
                sent = progress.text if delta else sent
                if progress.finished:
                    if delta:
                        yield content(progress, delta, None)
                    yield content(progress, None, progress.finish_reason)
                    for chunk in proto.closing_chunks(kind, progress, model, created, include_usage=req.include_usage, want_spec=req.return_spec_tokens_details):
                        yield proto.sse(chunk)
                elif delta:
                    yield content(progress, delta, None)
        except proto.ApiError as exc:
            yield proto.sse(exc.body())
        yield proto.SSE_DONE

    return JobStream(body(), job)

async def models(request: Request) -> Response:
    state = _state(request)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": state.served_name,
                    "object": "model",
                    "created": int(state.started_at),
                    "owned_by": "sparkit",
                    "root": state.served_name,
                    "max_model_len": state.context_length,
                }
            ],
        }
    )

async def server_info(request: Request) -> Response:
    state = _state(request)
    from sparkit._version import __version__

    info = state.server_args()
    internal: dict[str, Any] = {
        "#running-req": state.metrics.num_running_reqs,
        "#queue-req": state.metrics.num_queue_reqs,
        "last_gen_throughput": state.metrics.gen_throughput,
        "engine_state": state.worker.state if state.worker else "loading",
    }
    if state.speculative:
        internal["avg_spec_accept_length"] = state.metrics.avg_spec_accept_length
        internal["spec_verify_ct_total"] = state.metrics.spec_verify_calls_total
    info.update(
        {
            "version": __version__,
            "engine": "sparkit-embedded",
            "launch_command": state.launch_command(),
            "internal_states": [internal],
        }
    )
    return JSONResponse(info)

async def model_info(request: Request) -> Response:
    state = _state(request)
    config = state.model_config
    return JSONResponse(
        {
            "model_path": str(state.args.model_path),
            "tokenizer_path": str(state.args.model_path),
            "served_model_name": state.served_name,
            "is_generation": True,
            "architectures": config.get("architectures") or [],
            "model_type": config.get("model_type"),
            "context_length": state.context_length,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
        }
    )

async def metrics(request: Request) -> Response:
    state = _state(request)
    return PlainTextResponse(state.metrics.render(state.served_name), media_type="text/plain; version=0.0.4")

async def flush_cache(request: Request) -> Response:
    return PlainTextResponse("Cache flushed.\n")


ROUTES = [
    Route("/health", health, methods=["GET", "HEAD"]),
    Route("/health_generate", health_generate, methods=["GET"]),
    Route("/ready", health, methods=["GET"]),
    Route("/generate", generate, methods=["POST", "PUT"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/server_info", server_info, methods=["GET"]),
    Route("/get_server_info", server_info, methods=["GET"]),
    Route("/model_info", model_info, methods=["GET"]),
    Route("/get_model_info", model_info, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/flush_cache", flush_cache, methods=["POST", "GET"]),
]


async def api_error(request: Request, exc: Exception) -> Response:
    return error(exc)  # type: ignore[arg-type]

async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kinds = {404: "NotFoundError", 405: "MethodNotAllowed"}
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return JSONResponse(proto.error_body(exc.status_code, message, type=kinds.get(exc.status_code, "BadRequestError")), status_code=exc.status_code)

async def internal_error(request: Request, exc: Exception) -> Response:
    traceback.print_exception(exc, file=sys.stderr)
    return JSONResponse(proto.error_body(500, f"internal error: {type(exc).__name__}: {exc}", type="InternalServerError"), status_code=500)


def create_app(state: ServerState) -> Any:
    """The Starlette app over `state` (its routes find it as request.app.state.sparkit)."""
    app = Starlette(
        routes=ROUTES,
        exception_handlers={proto.ApiError: api_error, HTTPException: http_error, Exception: internal_error},
    )
    app.state.sparkit = state
    return BearerAuth(app, state.api_key) if state.api_key else app


def _content_chunk(kind: str, rid: str, model: str, created: int, text: str | None, finish: dict | None) -> dict:
    if kind == "chat":
        delta = {"content": text} if text is not None else {}
        return proto.chat_chunk(rid, model, created, delta, finish)
    return proto.completion_chunk(rid, model, created, text or "", finish)


class BearerAuth:
    """ASGI middleware: 'Authorization: Bearer KEY' on every path but /health."""

    OPEN_PATHS = frozenset({"/health"})

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in self.OPEN_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        import hmac

        if hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
            return await self.app(scope, receive, send)
        body = json.dumps(proto.error_body(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", type="AuthenticationError")).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
