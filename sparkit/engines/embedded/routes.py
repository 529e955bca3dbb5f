"""The HTTP surface: the state the routes share, the Starlette app and its handlers, bearer auth.
Request parsing and response shapes are protocol.py's; this module binds them to HTTP."""

from __future__ import annotations

import argparse
import asyncio
import inspect
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
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from sparkit.engines.embedded import protocol as proto
from sparkit.engines.embedded.api import LogprobRequest, SamplingParams
from sparkit.engines.embedded.gate import OFF_LOOP_BYTES
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
        self.max_request_bytes = args.max_request_bytes
        self.allow_request_chat_template = args.allow_request_chat_template
        self.live_jobs: dict[str, Job] = {}  # by rid, for /abort_request
        self._token_texts: Any = None
        self._longest_token: int | None = None

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def token_texts(self) -> Any:
        if self._token_texts is None:
            from sparkit.engines.embedded.tokenizer import TokenTexts

            self._token_texts = TokenTexts(self.tokenizer)
        return self._token_texts

    @property
    def longest_token_chars(self) -> int:
        """No token of the vocabulary spans more characters than this (its stored form is at
        least as long as its text), so a text longer than context * this cannot fit."""
        if self._longest_token is None:
            self._longest_token = max((len(piece) for piece in self.tokenizer.get_vocab()), default=1)
        return self._longest_token

    def submit(self, job: Job) -> None:
        require_ready(self).submit(job)
        self.live_jobs[job.rid] = job

    def done(self, job: Job) -> None:
        job.cancel.set()
        if self.live_jobs.get(job.rid) is job:
            del self.live_jobs[job.rid]

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
        return shlex.join([sys.executable, *(["-P"] if sys.flags.safe_path else []), "-m", "sparkit.engines.embedded",
                           *redacted_argv(self.argv)])

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

def new_job(ids: list[int], params: SamplingParams, stops: list[str], *, no_stop_trim: bool, skip_special: bool, stream: bool, rid: str | None, internal: bool = False, logprobs: LogprobRequest | None = None) -> Job:
    return Job(
        logprobs=logprobs,
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

async def updates(state: ServerState, job: Job):
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
        state.done(job)

async def run_to_end(state: ServerState, job: Job, request: Request) -> proto.RequestProgress:
    """Non-streamed: wait for the end, watching for the client leaving meanwhile."""
    state.submit(job)
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
        state.done(job)


async def read_body(request: Request, state: ServerState) -> bytes:
    """The body, read up to --max-request-bytes and never further (a 413 before anything is
    parsed); a client gone mid-body ends the request quietly (ClientDisconnect's handler)."""
    limit = state.max_request_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise proto.ApiError(413, f"the request body ({int(declared)} bytes) exceeds the server's limit of {limit} bytes "
                             "(--max-request-bytes)", type="RequestTooLarge")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise proto.ApiError(413, f"the request body exceeds the server's limit of {limit} bytes (--max-request-bytes)",
                                 type="RequestTooLarge")
        chunks.append(chunk)
    return b"".join(chunks)


async def parse(request: Request, state: ServerState, model: Any, where: str, ignored: list[str]) -> Any:
    raw = await read_body(request, state)
    if len(raw) > OFF_LOOP_BYTES:  # a large body is parsed and validated in a thread: /health goes on
        return await asyncio.to_thread(proto.parse_body, raw, model, where, ignored)
    return proto.parse_body(raw, model, where, ignored)


def with_ignored(response: Response, ignored: list[str]) -> Response:
    """Keys no request type defines are ignored, as SGLang ignores them; the response names them."""
    if ignored:
        response.headers["x-sparkit-ignored-fields"] = ",".join(sorted(set(ignored)))[:1000]
    return response


def check_text_fits(state: ServerState, text: str, field: str) -> None:
    """Refuse, before tokenising, a text that cannot fit in the context whatever its tokens."""
    context = state.context_length
    if context and len(text) > context * state.longest_token_chars:
        raise proto.ApiError(400, f"{field}: {len(text)} characters cannot fit in the model's context of {context} tokens "
                             f"(no token of its vocabulary is longer than {state.longest_token_chars} characters)")


async def encode(state: ServerState, text: str, field: str) -> list[int]:
    """Tokenise off the event loop: a long text must not hold up /health and the other clients."""
    check_text_fits(state, text, field)
    return await asyncio.to_thread(state.tokenizer.encode, text, add_special_tokens=False)


def logprob_request(state: ServerState, want: bool, start: int | None, top: int, n_prompt: int, field: str) -> LogprobRequest | None:
    if not want:
        return None
    if start is not None and start > n_prompt:
        raise proto.ApiError(400, f"logprob_start_len={start} is higher than the number of input tokens ({n_prompt})",
                             param="logprob_start_len")
    vocab = len(state.tokenizer)
    if top > vocab:
        raise proto.ApiError(400, f"{field}={top}: the vocabulary has {vocab} tokens", param=field)
    return LogprobRequest(input_start=start, top=top)

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
    ignored: list[str] = []
    req: proto.GenerateRequest = await parse(request, state, proto.GenerateRequest, "/generate", ignored)
    worker = require_ready(state)
    sp = req.sampling_params
    ids = list(req.input_ids) if req.input_ids is not None else await encode(state, req.text, "text")
    max_new = check_prompt(state, ids, sp.max_new_tokens, proto.DEFAULT_GENERATE_MAX_NEW_TOKENS)
    # SGLang: logprob_start_len -1 (its default) means no prompt positions
    start = None if req.logprob_start_len == -1 else req.logprob_start_len
    logprobs = logprob_request(state, req.return_logprob, start, req.top_logprobs_num, len(ids), "top_logprobs_num")
    view = proto.LogprobView(req.top_logprobs_num, state.token_texts if req.return_text_in_logprobs else None) if logprobs else None
    job = new_job(ids, sampling(sp, max_new, sp.sampling_seed), sp.stop_list(), no_stop_trim=sp.no_stop_trim, skip_special=sp.skip_special_tokens, stream=req.stream, rid=req.rid, logprobs=logprobs)
    if not req.stream:
        return with_ignored(JSONResponse(proto.generate_response(await run_to_end(state, job, request), logprobs=view)), ignored)
    state.submit(job)

    async def body():
        try:
            async for progress in updates(state, job):
                yield proto.sse(proto.generate_response(progress, streaming=True, logprobs=view))
        except proto.ApiError as exc:
            yield proto.sse(exc.body())
        yield proto.SSE_DONE

    return with_ignored(JobStream(body(), job), ignored)

def check_model(state: ServerState, name: str | None) -> None:
    if not state.accepts_model(name):
        raise proto.ApiError(404, f"The model `{name}` does not exist; this server serves `{state.served_name}`.", type="NotFoundError", param="model")

def template_kwargs(state: ServerState, kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """chat_template_kwargs are variables for the model's template. A key that is an argument of
    apply_chat_template itself would change what the call does (`tokenize`, `return_dict`,
    `tools`...) and `chat_template` would run a template the request wrote: refused, the last
    unless --allow-request-chat-template."""
    kwargs = dict(kwargs or {})
    reserved = set(inspect.signature(state.tokenizer.apply_chat_template).parameters) - {"kwargs"}
    reserved |= {"messages", "conversation", "add_generation_prompt"}
    for key in sorted(kwargs):
        if key == "chat_template" and state.allow_request_chat_template:
            continue
        if key == "chat_template":
            raise proto.ApiError(400, "chat_template_kwargs.chat_template: this server runs only the model's own chat "
                                 "template (start it with --allow-request-chat-template to allow one per request)",
                                 param="chat_template_kwargs.chat_template")
        if key in reserved:
            raise proto.ApiError(400, f"chat_template_kwargs.{key}: an argument of the templating call, not a template "
                                 "variable", param=f"chat_template_kwargs.{key}")
    return kwargs


async def render_chat(state: ServerState, messages_in: list[Any], chat_template_kwargs: Any, *,
                      add_generation_prompt: bool) -> list[int]:
    """A chat's prompt ids through the model's template: each message bounded first, the
    template and the tokenizer off the event loop (/health and other clients go on meanwhile),
    a template error a 400 (the request's fault)."""
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in messages_in]
    for i, m in enumerate(messages):
        check_text_fits(state, m["content"], f"messages.{i}.content")
    kwargs = template_kwargs(state, chat_template_kwargs)
    tokenizer = state.tokenizer

    def render() -> list[int]:
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs)
        return tokenizer.encode(prompt, add_special_tokens=False)

    try:
        return await asyncio.to_thread(render)
    except Exception as exc:  # noqa: BLE001 - a template error is the request's fault
        raise proto.ApiError(400, f"messages: the chat template failed: {type(exc).__name__}: {exc}") from None


async def chat_completions(request: Request) -> Response:
    state = _state(request)
    ignored: list[str] = []
    req: proto.ChatCompletionRequest = await parse(request, state, proto.ChatCompletionRequest, "/v1/chat/completions", ignored)
    check_model(state, req.model)
    require_ready(state)
    if req.input_ids is not None:  # SGLang's extension: the prompt's ids, the template skipped
        ids = list(req.input_ids)
    else:
        ids = await render_chat(state, req.messages, req.chat_template_kwargs, add_generation_prompt=True)
    max_new = check_prompt(state, ids, req.requested_max_tokens(), None)
    logprobs = logprob_request(state, req.logprobs, None, req.top_logprobs_num, len(ids), "top_logprobs")
    return with_ignored(await openai_response(state, "chat", req, ids, max_new, request, logprobs), ignored)

async def completions(request: Request) -> Response:
    state = _state(request)
    ignored: list[str] = []
    req: proto.CompletionRequest = await parse(request, state, proto.CompletionRequest, "/v1/completions", ignored)
    check_model(state, req.model)
    require_ready(state)
    prompt = req.prompt_text_or_ids()
    ids = list(prompt) if isinstance(prompt, list) else await encode(state, prompt, "prompt")
    max_new = check_prompt(state, ids, req.max_tokens, proto.DEFAULT_COMPLETION_MAX_TOKENS)
    # echo + logprobs: the prompt's logprobs too (what loglikelihood evaluation reads), as SGLang
    start = 0 if req.echo and req.logprobs is not None else None
    logprobs = logprob_request(state, req.logprobs is not None, start, req.logprobs or 0, len(ids), "logprobs")
    return with_ignored(await openai_response(state, "completion", req, ids, max_new, request, logprobs), ignored)

async def openai_response(state: ServerState, kind: str, req: Any, ids: list[int], max_new: int, request: Request,
                          logprobs: LogprobRequest | None) -> Response:
    model = state.served_name
    created = proto.now_created()
    texts = state.token_texts
    top = logprobs.top if logprobs else 0
    echo = ""
    if kind == "completion" and req.echo:
        prompt = req.prompt_text_or_ids()
        echo = prompt if isinstance(prompt, str) else state.tokenizer.decode(ids)
    job = new_job(ids, sampling(req, max_new, req.seed), req.stop_list(), no_stop_trim=req.no_stop_trim, skip_special=req.skip_special_tokens, stream=req.stream, rid=req.rid, logprobs=logprobs)
    if kind == "chat":
        job.rid = "chatcmpl-" + job.rid if not req.rid else job.rid
    else:
        job.rid = "cmpl-" + job.rid if not req.rid else job.rid

    def shaped_logprobs(progress: Any, start: int, end: int | None, offset: int) -> tuple[dict | None, int]:
        """The logprobs of output positions start:end (with echo, the prompt's before the first)."""
        if logprobs is None:
            return None, offset
        part = proto.slice_logprobs(progress.output_logprobs, start, end)
        if kind == "chat":
            return proto.chat_logprobs(part, texts, top), offset
        parts = [progress.input_logprobs] if start == 0 and progress.input_logprobs is not None else []
        return proto.completion_logprobs(parts + [part], texts, top, offset)

    if not req.stream:
        progress = await run_to_end(state, job, request)
        shown, _ = shaped_logprobs(progress, 0, None, 0)
        if kind == "chat":
            return JSONResponse(proto.chat_completion(progress, model, created, req.return_spec_tokens_details, logprobs=shown))
        return JSONResponse(proto.completion(progress, model, created, req.return_spec_tokens_details, logprobs=shown, echo=echo))
    state.submit(job)

    # stream_options.continuous_usage_stats: SGLang puts the cumulative usage on every
    # chunk, which is how a client counts the several tokens of a speculative chunk.
    continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)

    def content(progress: Any, delta: str | None, finish: Any, shown: dict | None = None) -> bytes:
        chunk = _content_chunk(kind, job.rid, model, created, delta, finish, shown)
        if continuous and progress is not None:
            chunk["usage"] = proto.usage(progress)
        return proto.sse(chunk)

    async def body():
        sent = ""
        sent_logprobs, offset = 0, len(echo)
        first = True
        try:
            if kind == "chat":
                yield proto.sse(proto.chat_chunk(job.rid, model, created, {"role": "assistant", "content": ""}))
            elif echo:
                yield content(None, echo, None)
            async for progress in updates(state, job):
                delta = progress.text[len(sent):] if progress.text.startswith(sent) else ""
                sent = progress.text if delta else sent
                shown = None
                if logprobs is not None:
                    have = len(progress.output_logprobs.token_ids) if progress.output_logprobs else 0
                    if have > sent_logprobs or (first and progress.input_logprobs is not None):
                        start = 0 if first else sent_logprobs
                        shown, offset = shaped_logprobs(progress, start, have, 0 if first and kind == "completion" and echo else offset)
                        sent_logprobs = have
                first = False
                if progress.finished:
                    if delta or shown:
                        yield content(progress, delta, None, shown)
                    yield content(progress, None, progress.finish_reason)
                    for chunk in proto.closing_chunks(kind, progress, model, created, include_usage=req.include_usage, want_spec=req.return_spec_tokens_details):
                        yield proto.sse(chunk)
                elif delta or shown:
                    yield content(progress, delta, None, shown)
        except proto.ApiError as exc:
            yield proto.sse(exc.body())
        yield proto.SSE_DONE

    return JobStream(body(), job)

def model_card(state: ServerState, name: str) -> dict[str, Any]:
    """SGLang's ModelCard."""
    return {"id": name, "object": "model", "created": int(state.started_at), "owned_by": "sparkit",
            "root": name, "parent": None, "max_model_len": state.context_length}


async def models(request: Request) -> Response:
    state = _state(request)
    return JSONResponse({"object": "list", "data": [model_card(state, state.served_name)]})


async def retrieve_model(request: Request) -> Response:
    """GET /v1/models/{id}: the card of the served model, else SGLang's 404 body."""
    state = _state(request)
    name = request.path_params["model"]
    if name != state.served_name:
        return JSONResponse({"error": {"message": f"The model '{name}' does not exist", "type": "invalid_request_error",
                                       "param": "model", "code": "model_not_found"}}, status_code=404)
    return JSONResponse(model_card(state, name))


async def abort_request(request: Request) -> Response:
    """SGLang's /abort_request: {"rid": ..., "abort_all": bool}; 200 with an empty body, a rid that
    is not running included (SGLang does the same)."""
    state = _state(request)
    body = await parse(request, state, proto.AbortRequest, "/abort_request", [])
    if body.abort_all and not state.api_key:  # with a key, BearerAuth let only its holders this far
        raise proto.ApiError(403, "abort_all stops every client's requests: only a holder of the server's API key may "
                             f"(start it with ${API_KEY_ENV} set); abort your own request by its rid", type="ForbiddenError",
                             param="abort_all")
    targets = list(state.live_jobs.values()) if body.abort_all else [state.live_jobs[body.rid]] if body.rid in state.live_jobs else []
    for job in targets:
        job.cancel.set()
    return Response(status_code=200)


async def tokenize(request: Request) -> Response:
    """SGLang's /tokenize (and /v1/tokenize): {"tokens", "count", "max_model_len"}."""
    state = _state(request)
    req: proto.TokenizeRequest = await parse(request, state, proto.TokenizeRequest, request.url.path, [])
    check_model(state, req.model)
    require_ready(state)
    tokenizer = state.tokenizer
    if req.messages is not None:
        add_generation = True if req.add_generation_prompt is None else req.add_generation_prompt
        tokens: Any = await render_chat(state, req.messages, req.chat_template_kwargs, add_generation_prompt=add_generation)
        count: Any = len(tokens)
    else:
        prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt or [])
        for i, text in enumerate(prompts):
            check_text_fits(state, text, "prompt" if isinstance(req.prompt, str) else f"prompt.{i}")
        encoded = await asyncio.to_thread(lambda: [tokenizer.encode(t, add_special_tokens=req.add_special_tokens) for t in prompts])
        tokens, count = (encoded[0], len(encoded[0])) if isinstance(req.prompt, str) else (encoded, [len(e) for e in encoded])
    return JSONResponse({"tokens": tokens, "count": count, "max_model_len": state.context_length})


async def detokenize(request: Request) -> Response:
    """SGLang's /detokenize (and /v1/detokenize): {"text"} (a list for a list of id lists)."""
    state = _state(request)
    req: proto.DetokenizeRequest = await parse(request, state, proto.DetokenizeRequest, request.url.path, [])
    check_model(state, req.model)
    require_ready(state)
    batches = req.tokens if req.tokens and isinstance(req.tokens[0], list) else [req.tokens]
    for ids in batches:
        if state.vocab_size and any(not 0 <= i < state.vocab_size for i in ids):
            raise proto.ApiError(400, f"tokens: every id must be an integer in [0, {state.vocab_size})", param="tokens")
    texts = [state.tokenizer.decode(ids, skip_special_tokens=req.skip_special_tokens) for ids in batches]
    return JSONResponse({"text": texts if req.tokens and isinstance(req.tokens[0], list) else texts[0]})


async def version(request: Request) -> Response:
    """{"version": ...}. SGLang 0.5.23 has no /version (its version is in /server_info); vLLM and
    tools written for it ask here, and the answer is this shape."""
    from sparkit._version import __version__

    return JSONResponse({"version": __version__})

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


async def _profile_body(request: Request, state: ServerState) -> dict[str, Any]:
    raw = await read_body(request, state)
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise proto.ApiError(400, f"the request body is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise proto.ApiError(400, "the request body is not a JSON object")
    return body


async def start_profile(request: Request) -> Response:
    """SGLang's /start_profile: a torch.profiler trace of the next forward passes
    (sparkit.engines.embedded.profiling)."""
    from sparkit.engines.embedded.profiling import ProfileRequest

    state = _state(request)
    worker = require_ready(state)
    worker.profile.start(ProfileRequest.from_body(await _profile_body(request, state)))
    worker.wake()
    return PlainTextResponse("Start profiling.\n")


async def stop_profile(request: Request) -> Response:
    """SGLang's /stop_profile: stops the profile and writes its trace (returns once written)."""
    state = _state(request)
    worker = require_ready(state)
    worker.profile.stop()
    worker.wake()
    await asyncio.to_thread(worker.profile.done.wait, 120)
    if worker.profile.error:
        raise proto.ApiError(500, f"the profile could not be written: {worker.profile.error}", type="InternalServerError")
    return PlainTextResponse("Stop profiling. This will take some time.\n")


ROUTES = [
    Route("/health", health, methods=["GET", "HEAD"]),
    Route("/health_generate", health_generate, methods=["GET"]),
    Route("/ready", health, methods=["GET"]),
    Route("/generate", generate, methods=["POST", "PUT"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
    Route("/abort_request", abort_request, methods=["POST"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/v1/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/v1/detokenize", detokenize, methods=["POST"]),
    Route("/version", version, methods=["GET"]),
    Route("/server_info", server_info, methods=["GET"]),
    Route("/get_server_info", server_info, methods=["GET"]),
    Route("/model_info", model_info, methods=["GET"]),
    Route("/get_model_info", model_info, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/flush_cache", flush_cache, methods=["POST", "GET"]),
    Route("/start_profile", start_profile, methods=["GET", "POST"]),
    Route("/stop_profile", stop_profile, methods=["GET", "POST"]),
]


async def api_error(request: Request, exc: Exception) -> Response:
    return error(exc)  # type: ignore[arg-type]

async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kinds = {404: "NotFoundError", 405: "MethodNotAllowed"}
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return JSONResponse(proto.error_body(exc.status_code, message, type=kinds.get(exc.status_code, "BadRequestError")), status_code=exc.status_code)

async def client_gone(request: Request, exc: Exception) -> Response:
    """The client closed the connection mid-body: nobody to answer, nothing to log."""
    return Response(status_code=499)

async def internal_error(request: Request, exc: Exception) -> Response:
    traceback.print_exception(exc, file=sys.stderr)
    return JSONResponse(proto.error_body(500, f"internal error: {type(exc).__name__}: {exc}", type="InternalServerError"), status_code=500)


def create_app(state: ServerState, inner: Any = None) -> Any:
    """The Starlette app over `state` (its routes find it as request.app.state.sparkit); `inner`
    wraps it inside the authentication (main puts the body gate there: sparkit.engines.embedded.gate)."""
    app = Starlette(
        routes=ROUTES,
        exception_handlers={proto.ApiError: api_error, HTTPException: http_error, ClientDisconnect: client_gone,
                            Exception: internal_error},
    )
    app.state.sparkit = state
    served = inner(app) if inner is not None else app
    return BearerAuth(served, state.api_key) if state.api_key else served


def _content_chunk(kind: str, rid: str, model: str, created: int, text: str | None, finish: dict | None,
                   logprobs: dict | None = None) -> dict:
    if kind == "chat":
        delta = {"content": text} if text is not None else {}
        return proto.chat_chunk(rid, model, created, delta, finish, logprobs=logprobs)
    return proto.completion_chunk(rid, model, created, text or "", finish, logprobs=logprobs)


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
