"""The HTTP surface: the state the routes share, the Starlette app and its handlers, bearer auth.
Request parsing is requests.py's and response shapes responses.py's; this module binds them to HTTP."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import shlex
import sys
import threading
import time
import traceback
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from sparkit.api_key import engine_key
from sparkit.engines.embedded import requests, responses
from sparkit.engines.embedded.api import LogprobRequest, SamplingParams
from sparkit.engines.embedded.gate import OFF_LOOP_BYTES
from sparkit.engines.embedded.server_metrics import ServerMetrics
from sparkit.engines.embedded.settings import API_KEY_ENV, engine_config, redacted_argv
from sparkit.engines.embedded.tool_calls import ToolCallItem, ToolDef, ToolUse
from sparkit.engines.embedded.worker import EngineWorker, Job, RequestLimits

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
        self.api_key = engine_key(args.api_key)
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
        self.max_new_tokens_limit: int | None = args.max_new_tokens_limit
        self._grammar_pool: Any = None
        self._grammar_pool_lock = threading.Lock()
        self._token_texts: Any = None
        self._longest_token: int | None = None

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def token_texts(self) -> Any:
        if self._token_texts is None:
            from sparkit.models.tiny_ling.tokenizer import TokenTexts

            self._token_texts = TokenTexts(self.tokenizer)
        return self._token_texts

    @property
    def longest_token_chars(self) -> int:
        """No token of the vocabulary spans more characters than this (its stored form is at
        least as long as its text), so a text longer than context * this cannot fit."""
        if self._longest_token is None:
            self._longest_token = max((len(piece) for piece in self.tokenizer.get_vocab()), default=1)
        return self._longest_token

    def request_limits(self) -> RequestLimits:
        """A new request's time limits (--request-running-timeout, --request-waiting-timeout)."""
        return RequestLimits(running_s=self.args.request_running_timeout, waiting_s=self.args.request_waiting_timeout)

    def grammar_pool(self) -> Any:
        """The grammar compiles' child processes (grammar_pool.py), made once the engine has loaded."""
        with self._grammar_pool_lock:
            if self._grammar_pool is None:
                from sparkit.engines.embedded.grammar import tokenizer_info
                from sparkit.engines.embedded.grammar_pool import GrammarPool, default_workers

                engine, a = self.engine, self.args
                self._grammar_pool = GrammarPool(
                    tokenizer_info(engine.tokenizer, engine.vocab_limit, engine.model_config.eos_token_id),
                    workers=a.grammar_compile_workers or default_workers(), timeout_s=a.grammar_compile_timeout,
                    max_chars=a.grammar_max_chars, any_whitespace=not self.config.constrained_json_disable_any_whitespace,
                    max_whitespace_cnt=self.config.constrained_json_max_whitespace_cnt, on_event=self.note)
            return self._grammar_pool

    def close_grammar_pool(self) -> None:
        """Kill the idle compile processes (at shutdown; a running one dies with the forkserver)."""
        with self._grammar_pool_lock:
            pool, self._grammar_pool = self._grammar_pool, None
        if pool is not None:
            pool.close()

    def note(self, line: str) -> None:
        """A server event worth one log line per cause (the gate's Causes when main set it)."""
        causes = getattr(self, "causes", None)
        if causes is not None:
            causes.note(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def submit(self, job: Job) -> None:
        self.submit_all([job])

    def submit_all(self, jobs: list[Job]) -> None:
        """Queue a request's jobs (its prompts x n samples) together: all or, when the queue
        cannot take them all, none (a 503)."""
        require_ready(self).submit_all(jobs)
        for job in jobs:
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
            "decode_log_interval": a.decode_log_interval,
            "max_new_tokens_limit": a.max_new_tokens_limit,
            "request_running_timeout": a.request_running_timeout,
            "request_waiting_timeout": a.request_waiting_timeout,
            "grammar_compile_timeout": a.grammar_compile_timeout,
            "grammar_max_chars": a.grammar_max_chars,
            "tool_call_parser": a.tool_call_parser,
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


# SGLang answers /generate's errors as {"error": {...}}, every other route's with its flat
# ErrorResponse (sglang/srt/entrypoints/http_server.py, openai/serving_base.py).
NESTED_ERROR_PATHS = frozenset({"/generate"})


def error(exc: requests.ApiError, path: str = "") -> JSONResponse:
    return JSONResponse(exc.body(nested=path in NESTED_ERROR_PATHS), status_code=exc.status)

def require_ready(state: ServerState) -> EngineWorker:
    worker = state.worker
    if worker is None or not worker.ready:
        raise requests.ApiError(503, "the engine is starting; retry when /health answers 200", type="ServiceUnavailableError")
    return worker

class JobStream(StreamingResponse):
    """Sets its jobs' cancel flags however the response ends (client gone included)."""

    def __init__(self, content, jobs: Job | list[Job], media_type: str = "text/event-stream") -> None:
        super().__init__(content, media_type=media_type, headers={"Cache-Control": "no-cache"})
        self.jobs = jobs if isinstance(jobs, list) else [jobs]

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for job in self.jobs:
                job.cancel.set()

def new_job(ids: list[int], params: SamplingParams, stops: list[str], *, no_stop_trim: bool, skip_special: bool, stream: bool,
            rid: str | None, internal: bool = False, logprobs: LogprobRequest | None = None, group: str | None = None,
            limits: RequestLimits | None = None) -> Job:
    return Job(
        group=group,
        limits=limits,
        logprobs=logprobs,
        rid=rid or responses.new_request_id(),
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

async def updates_of_all(state: ServerState, jobs: list[Job]):
    """(index, progress) for a request's jobs in order: the worker runs them one after another,
    so job i's snapshots all come before job i+1's (SGLang interleaves them; each chunk says its
    index either way)."""
    for index, job in enumerate(jobs):
        async for progress in updates(state, job):
            yield index, progress


async def run_to_end(state: ServerState, job: Job, request: Request) -> responses.RequestProgress:
    return (await run_all(state, [job], request))[0]


async def run_all(state: ServerState, jobs: list[Job], request: Request) -> list[responses.RequestProgress]:
    """Non-streamed: queue the jobs, wait for each to end (in order), watching for the client
    leaving meanwhile (then every job of the request is cancelled)."""
    state.submit_all(jobs)
    try:
        results = []
        last_check = time.monotonic()
        for job in jobs:
            while True:
                try:
                    item = await asyncio.wait_for(job.updates.get(), timeout=0.25)
                except TimeoutError:
                    item = None
                if isinstance(item, BaseException):
                    raise item
                if item is not None and item.finished:
                    results.append(item)
                    break
                if time.monotonic() - last_check >= 0.25:
                    last_check = time.monotonic()
                    if await request.is_disconnected():
                        raise requests.ApiError(499, "client disconnected", type="ClientClosedRequest")
        return results
    finally:
        for job in jobs:
            state.done(job)


async def read_body(request: Request, state: ServerState) -> bytes:
    """The body, read up to --max-request-bytes and never further (a 413 before anything is
    parsed); a client gone mid-body ends the request quietly (ClientDisconnect's handler)."""
    limit = state.max_request_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise requests.ApiError(413, f"the request body ({int(declared)} bytes) exceeds the server's limit of {limit} bytes "
                                "(--max-request-bytes)", type="RequestTooLarge")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise requests.ApiError(413, f"the request body exceeds the server's limit of {limit} bytes (--max-request-bytes)",
                                    type="RequestTooLarge")
        chunks.append(chunk)
    return b"".join(chunks)


async def parse(request: Request, state: ServerState, model: Any, where: str, ignored: list[str]) -> Any:
    raw = await read_body(request, state)
    if len(raw) > OFF_LOOP_BYTES:  # a large body is parsed and validated in a thread: /health goes on
        return await asyncio.to_thread(requests.parse_body, raw, model, where, ignored)
    return requests.parse_body(raw, model, where, ignored)


IGNORED_HEADER_CHARS = 1000
IGNORED_NAME_CHARS = 100


def header_safe(name: str) -> str:
    """A field name as header text: printable ASCII kept, anything else (and ',' and the
    backslash) as a \\uXXXX escape, at most IGNORED_NAME_CHARS characters. A header is latin-1
    without control characters: an unknown field named "é一" was a 500, one holding CR LF or NUL
    a dropped connection."""
    escaped = "".join(c if " " <= c <= "~" and c not in ",\\" else f"\\u{ord(c):04x}" for c in name[:IGNORED_NAME_CHARS])
    return escaped + ("..." if len(name) > IGNORED_NAME_CHARS else "")


def with_ignored(response: Response, ignored: list[str]) -> Response:
    """Keys no request type defines are ignored, as SGLang ignores them; the response names them
    (each escaped and shortened, the list cut at IGNORED_HEADER_CHARS with a count of the rest)."""
    if not ignored:
        return response
    names = sorted(set(ignored))
    shown: list[str] = []
    size = 0
    for i, name in enumerate(names):
        text = header_safe(name)
        if size + len(text) + 1 > IGNORED_HEADER_CHARS:
            shown.append(f"...{len(names) - i} more")
            break
        shown.append(text)
        size += len(text) + 1
    response.headers["x-sparkit-ignored-fields"] = ",".join(shown)
    return response


def check_text_fits(state: ServerState, text: str, field: str) -> None:
    """Refuse, before tokenising, a text that cannot fit in the context whatever its tokens."""
    context = state.context_length
    if context and len(text) > context * state.longest_token_chars:
        raise requests.ApiError(400, f"{field}: {len(text)} characters cannot fit in the model's context of {context} tokens "
                                f"(no token of its vocabulary is longer than {state.longest_token_chars} characters)")


async def encode(state: ServerState, text: str, field: str) -> list[int]:
    """Tokenise off the event loop: a long text must not hold up /health and the other clients."""
    check_text_fits(state, text, field)
    return await asyncio.to_thread(state.tokenizer.encode, text, add_special_tokens=False)


def logprob_request(state: ServerState, want: bool, start: int | None, top: int, n_prompt: int, field: str) -> LogprobRequest | None:
    if not want:
        return None
    if start is not None and start > n_prompt:
        raise requests.ApiError(400, f"logprob_start_len={start} is higher than the number of input tokens ({n_prompt})",
                                param="logprob_start_len")
    vocab = len(state.tokenizer)
    if top > vocab:
        raise requests.ApiError(400, f"{field}={top}: the vocabulary has {vocab} tokens", param=field)
    return LogprobRequest(input_start=start, top=top)

def check_prompt(state: ServerState, ids: list[int], requested_max: int | None, default_max: int | None, *,
                 field: str = "max_new_tokens/max_tokens") -> int:
    """Validate prompt length against the context; returns max_new_tokens to use."""
    context = state.context_length
    if not ids:
        raise requests.ApiError(400, "the prompt is empty (0 tokens)")
    if state.vocab_size and any((not isinstance(i, int)) or i < 0 or i >= state.vocab_size for i in ids):
        raise requests.ApiError(400, f"input_ids: every id must be an integer in [0, {state.vocab_size})")
    if context and len(ids) >= context:
        raise requests.ApiError(
            400,
            f"The input ({len(ids)} tokens) is longer than the model's context length ({context} tokens).",
        )
    room = context - len(ids) if context else None
    limit = state.max_new_tokens_limit
    if limit is not None:  # SGLang's SGLANG_MAX_NEW_TOKENS_LIMIT: a larger ask is capped, not refused
        requested_max = min(requested_max, limit) if requested_max is not None else None
        default_max = min(default_max, limit) if default_max is not None else limit
    if requested_max is not None:
        if room is not None and requested_max > room:
            raise requests.ApiError(
                400,
                f"Requested token count exceeds the model's maximum context length of {context} tokens. "
                f"You requested a total of {len(ids) + requested_max} tokens: {len(ids)} tokens from the input "
                f"and {requested_max} tokens for the completion. Reduce the prompt or {field}.",
            )
        return requested_max
    if default_max is None:
        return room if room is not None else requests.DEFAULT_GENERATE_MAX_NEW_TOKENS
    return min(default_max, room) if room is not None else default_max

def sampling(state: ServerState, req: requests._SamplingFields, *, max_new_tokens: int, min_new_tokens: int,
             seed: int | None, grammar: Any = None) -> SamplingParams:
    """The engine's SamplingParams for one job, checked as SGLang's SamplingParams.verify checks them."""
    if min_new_tokens > max_new_tokens:
        raise requests.ApiError(400, f"min_new_tokens must be in [0, max_new_tokens({max_new_tokens})], got {min_new_tokens}.",
                                param="min_tokens" if isinstance(req, requests._OpenAIRequest) else "min_new_tokens")
    kwargs = req.sampling_kwargs()
    vocab = state.vocab_size
    for token in kwargs["logit_bias"]:
        if vocab and not 0 <= token < vocab:
            raise requests.ApiError(400, f"logit_bias must has keys in [0, {vocab - 1}], got {token}.", param="logit_bias")
    return SamplingParams(**kwargs, max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, seed=seed, grammar=grammar)


def sample_seed(seed: int | None, sample: int) -> int | None:
    """The seed of a prompt's `sample`-th of n samples: reproducible, and different from its
    siblings' (the same seed for all n would give n equal samples)."""
    return None if seed is None else seed + sample


async def compile_grammar(state: ServerState, req: requests._SamplingFields, request: Request,
                          cache: dict | None = None, *, field: str | None = None,
                          constraint: tuple[str, str] | None = None) -> Any:
    """The request's grammar (regex / json_schema / ebnf / response_format, or `constraint` when
    given), compiled in the server's grammar pool (bounded in size, time and number, abandoned when
    the client leaves); one that does not compile is a 400 with SGLang's message, before any work."""
    constraint = constraint or req.constraint()
    if constraint is None:
        return None
    if cache is not None and constraint in cache:
        return cache[constraint]
    kind, source = constraint
    from sparkit.engines.embedded.grammar import GrammarError
    from sparkit.engines.embedded.grammar_pool import ClientLeft, GrammarPoolBusy

    require_ready(state)
    try:
        grammar = await state.grammar_pool().compile(kind, source, request.is_disconnected)
    except GrammarError as exc:
        raise requests.ApiError(400, str(exc), param=field or req.constraint_field()) from None
    except GrammarPoolBusy as exc:
        raise requests.ApiError(503, str(exc), type="ServiceUnavailableError") from None
    except ClientLeft:
        raise requests.ApiError(499, "client disconnected", type="ClientClosedRequest") from None
    except ImportError:
        raise requests.ApiError(400, f"{kind}: constrained decoding needs the xgrammar package, which this server "
                                "does not have (pip install 'sparkit[embedded]')", param=kind) from None
    if cache is not None:
        cache[constraint] = grammar
    return grammar

# -- routes (one function per endpoint, as SGLang's serving_* files; the shared state is the app's)

# /health waits this long for the default executor, which tokenises and templates every request.
HEALTH_EXECUTOR_TIMEOUT_S = 5.0


async def health(request: Request) -> Response:
    """200 when a request would be served: the engine is ready, its thread alive, and the executor
    every request is tokenised and templated in runs a no-op within HEALTH_EXECUTOR_TIMEOUT_S
    (issue 40: eight grammar compiles held that executor, and /health said OK while every chat
    timed out)."""
    state = _state(request)
    worker = state.worker
    if worker is None or not worker.ready or not worker.thread.is_alive():
        return Response(status_code=503)
    try:
        await asyncio.wait_for(asyncio.to_thread(lambda: None), HEALTH_EXECUTOR_TIMEOUT_S)
    except TimeoutError:
        state.note(f"health: 503 while the request executor ran nothing for {HEALTH_EXECUTOR_TIMEOUT_S:g} s")
        return Response(status_code=503)
    return Response(status_code=200)

async def health_generate(request: Request) -> Response:
    state = _state(request)
    worker = state.worker
    if worker is None or not worker.ready:
        return Response(status_code=503)
    ids = worker.engine.tokenizer.encode("ping", add_special_tokens=False)
    job = new_job(ids, SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True), [], no_stop_trim=False, skip_special=True, stream=False, rid=None, internal=True)
    try:
        await run_to_end(state, job, request)
    except requests.ApiError:
        return Response(status_code=503)
    return Response(status_code=200)

async def generate(request: Request) -> Response:
    """SGLang's /generate: one prompt (an object back) or a batch / n samples (a list back, in
    order, each with its own meta_info; streamed, each chunk carries its "index")."""
    state = _state(request)
    ignored: list[str] = []
    req: requests.GenerateRequest = await parse(request, state, requests.GenerateRequest, "/generate", ignored)
    require_ready(state)
    items = req.items()
    single = req.is_single
    field = "input_ids" if req.input_ids is not None else "text"
    listed = isinstance(req.text, list) or (req.input_ids is not None and isinstance(req.input_ids[0], list))
    prompt_ids: dict[int, list[int]] = {}
    grammars: dict = {}
    jobs, views = [], []
    limits = state.request_limits()
    group = req.rid if isinstance(req.rid, str) else None
    for item in items:
        ids = prompt_ids.get(item.prompt_index)
        if ids is None:
            where = f"{field}.{item.prompt_index}" if listed else field
            ids = list(item.prompt) if isinstance(item.prompt, list) else await encode(state, item.prompt, where)
            prompt_ids[item.prompt_index] = ids
        sp = item.sampling
        max_new = check_prompt(state, ids, sp.max_new_tokens, requests.DEFAULT_GENERATE_MAX_NEW_TOKENS)
        # SGLang: logprob_start_len -1 (its default) means no prompt positions
        start = None if item.logprob_start_len == -1 else item.logprob_start_len
        logprobs = logprob_request(state, item.return_logprob, start, item.top_logprobs_num, len(ids), "top_logprobs_num")
        views.append(responses.LogprobView(item.top_logprobs_num, state.token_texts if req.return_text_in_logprobs else None)
                     if logprobs else None)
        params = sampling(state, sp, max_new_tokens=max_new, min_new_tokens=sp.min_new_tokens or 0,
                          seed=sample_seed(sp.sampling_seed, item.sample),
                          grammar=await compile_grammar(state, sp, request, grammars))
        jobs.append(new_job(ids, params, sp.stop_list(), no_stop_trim=sp.no_stop_trim, skip_special=sp.skip_special_tokens,
                            stream=req.stream, rid=item.rid, logprobs=logprobs, group=group, limits=limits))
    if not req.stream:
        results = await run_all(state, jobs, request)
        bodies = [responses.generate_response(progress, logprobs=view) for progress, view in zip(results, views)]
        return with_ignored(JSONResponse(bodies[0] if single else bodies), ignored)
    state.submit_all(jobs)

    async def body():
        try:
            async for index, progress in updates_of_all(state, jobs):
                chunk = responses.generate_response(progress, streaming=True, logprobs=views[index])
                if not single:
                    chunk["index"] = index
                yield responses.sse(chunk)
        except requests.ApiError as exc:
            yield responses.sse(exc.body())
        yield responses.SSE_DONE

    return with_ignored(JobStream(body(), jobs), ignored)

def check_model(state: ServerState, name: str | None) -> None:
    if not state.accepts_model(name):
        raise requests.ApiError(404, f"The model `{name}` does not exist; this server serves `{state.served_name}`.", type="NotFoundError", param="model")

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
            raise requests.ApiError(400, "chat_template_kwargs.chat_template: this server runs only the model's own chat "
                                    "template (start it with --allow-request-chat-template to allow one per request)",
                                    param="chat_template_kwargs.chat_template")
        if key in reserved:
            raise requests.ApiError(400, f"chat_template_kwargs.{key}: an argument of the templating call, not a template "
                                    "variable", param=f"chat_template_kwargs.{key}")
    return kwargs


def template_message(message: Any, i: int) -> dict[str, Any]:
    """A request's message as the chat template reads it: its role and text, an assistant's calls
    with their arguments as objects (SGLang's normalize_assistant_tool_call_arguments)."""
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role, "content": message.text()}
    calls = message.calls()
    if calls:
        out["tool_calls"] = [{"type": "function", "function": {
            "name": call.name, "arguments": call.argument_object(f"messages.{i}.tool_calls.{j}.function.arguments")}}
            for j, call in enumerate(calls)]
    return out


async def render_chat(state: ServerState, messages_in: list[Any], chat_template_kwargs: Any, *,
                      add_generation_prompt: bool, tools: list[dict[str, Any]] | None = None) -> list[int]:
    """A chat's prompt ids through the model's template (`tools` shown to the model when given):
    each message bounded first, the template and the tokenizer off the event loop (/health and
    other clients go on meanwhile), a template error a 400 (the request's fault)."""
    messages = [template_message(m, i) for i, m in enumerate(messages_in)]
    for i, m in enumerate(messages):
        check_text_fits(state, m["content"], f"messages.{i}.content")
    if tools:
        check_text_fits(state, json.dumps(tools), "tools")
    kwargs = template_kwargs(state, chat_template_kwargs)
    if tools:
        kwargs["tools"] = tools
    tokenizer = state.tokenizer

    def render() -> list[int]:
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs)
        return tokenizer.encode(prompt, add_special_tokens=False)

    try:
        return await asyncio.to_thread(render)
    except Exception as exc:  # noqa: BLE001 - a template error is the request's fault
        raise requests.ApiError(400, f"messages: the chat template failed: {type(exc).__name__}: {exc}") from None


# -- the OpenAI endpoints: one responder each over a shared template (SGLang's serving_base.py) --------


@dataclass
class OpenAIRun:
    """One OpenAI request on its way: its prompts' ids, its jobs (each prompt x n samples,
    prompt-major: job k is prompt k // n) and what its response needs."""

    req: Any
    prompt_ids: list[list[int]]
    jobs: list[Job]
    logprobs: list[LogprobRequest | None]
    rid: str
    created: int
    model: str
    tools: ToolUse = field(default_factory=ToolUse)  # what the chat's tools mean for its reply
    streams: dict[int, StreamState] = field(default_factory=dict)  # what a stream has sent, per choice

    @property
    def n(self) -> int:
        return self.req.samples


class OpenAIServing:
    """One OpenAI endpoint: parse, check the model, the prompts' ids (`prompt_ids`), one job per
    prompt and sample, then the whole response (`choice` per job, usage over all) or its stream
    (`stream_chunks` per snapshot, `closing` at the end). Subclasses say what differs."""

    path: str
    request_model: type
    id_prefix: str
    object_name: str
    chunk_object: str
    default_max_tokens: int | None

    async def handle(self, request: Request) -> Response:
        """The route handler (the template)."""
        state = _state(request)
        ignored: list[str] = []
        req = await parse(request, state, self.request_model, self.path, ignored)
        check_model(state, req.model)
        require_ready(state)
        run = await self.plan(state, req, request)
        if req.stream:
            state.submit_all(run.jobs)
            return with_ignored(JobStream(self.stream(state, run), run.jobs), ignored)
        results = await run_all(state, run.jobs, request)
        return with_ignored(JSONResponse(self.response(state, run, results)), ignored)

    async def prompt_ids(self, state: ServerState, req: Any) -> list[list[int]]:
        raise NotImplementedError

    def requested_max_tokens(self, req: Any) -> int | None:
        return req.max_tokens

    def logprob_request(self, state: ServerState, req: Any, ids: list[int]) -> LogprobRequest | None:
        raise NotImplementedError

    def tool_use(self, state: ServerState, req: Any) -> ToolUse:
        return ToolUse()

    async def plan(self, state: ServerState, req: Any, request: Request) -> OpenAIRun:
        prompts = await self.prompt_ids(state, req)
        tools = self.tool_use(state, req)
        grammar = await compile_grammar(state, req, request, constraint=tools.constraint(),
                                        field="tools" if tools.forced else None)
        rid = req.rid or self.id_prefix + responses.new_request_id()
        jobs, logprobs = [], []
        limits = state.request_limits()
        for i, ids in enumerate(prompts):
            max_new = check_prompt(state, ids, self.requested_max_tokens(req), self.default_max_tokens)
            want = self.logprob_request(state, req, ids)
            for j in range(req.samples):
                params = sampling(state, req, max_new_tokens=max_new, min_new_tokens=req.min_tokens,
                                  seed=sample_seed(req.seed, j), grammar=grammar)
                job_rid = rid if len(prompts) * req.samples == 1 else f"{rid}_{i * req.samples + j}"
                jobs.append(new_job(ids, params, req.stop_list(), no_stop_trim=req.no_stop_trim,
                                    skip_special=req.skip_special_tokens, stream=req.stream, rid=job_rid, logprobs=want,
                                    group=rid, limits=limits))
                logprobs.append(want)
        return OpenAIRun(req, prompts, jobs, logprobs, rid, responses.now_created(), state.served_name, tools)

    # -- the whole response
    def response(self, state: ServerState, run: OpenAIRun, results: list[responses.RequestProgress]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": run.rid, "object": self.object_name, "created": run.created, "model": run.model,
            "choices": [self.choice(state, run, k, progress) for k, progress in enumerate(results)],
            "usage": responses.total_usage(results, run.n),
        }
        ext = responses.sglext_of(results, run.req.return_spec_tokens_details, run.n)
        if ext:
            body["sglext"] = ext
        return body

    def choice(self, state: ServerState, run: OpenAIRun, index: int, progress: responses.RequestProgress) -> dict[str, Any]:
        raise NotImplementedError

    # -- the stream
    async def stream(self, state: ServerState, run: OpenAIRun):
        req = run.req
        # stream_options.continuous_usage_stats: SGLang puts the choice's cumulative usage on
        # every chunk, which is how a client counts the several tokens of a speculative chunk.
        continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
        sent = run.streams
        finished: dict[int, responses.RequestProgress] = {}
        try:
            async for index, progress in updates_of_all(state, run.jobs):
                track = sent.setdefault(index, StreamState())
                for chunk in self.stream_chunks(state, run, index, progress, track):
                    if continuous and chunk["choices"]:
                        chunk["usage"] = responses.usage(progress)
                    yield responses.sse(chunk)
                if progress.finished:
                    finished[index] = progress
            for chunk in self.closing(run, [finished[k] for k in sorted(finished)]):
                yield responses.sse(chunk)
        except requests.ApiError as exc:
            yield responses.sse(exc.body())
        yield responses.SSE_DONE

    def stream_chunks(self, state: ServerState, run: OpenAIRun, index: int, progress: responses.RequestProgress,
                      track: StreamState) -> list[dict[str, Any]]:
        raise NotImplementedError

    def closing(self, run: OpenAIRun, results: list[responses.RequestProgress]) -> list[dict[str, Any]]:
        """After the last choice: SGLang's choice-less sglext chunk, then usage."""
        chunks = []
        ext = responses.sglext_of(results, run.req.return_spec_tokens_details, run.n)
        if ext:
            chunks.append(self._chunk(run, [], sglext=ext))
        if run.req.include_usage:
            chunks.append(self._chunk(run, [], usage=responses.total_usage(results, run.n)))
        return chunks

    def _chunk(self, run: OpenAIRun, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": run.rid, "object": self.chunk_object, "created": run.created, "model": run.model,
                "choices": choices, **extra}

    def new_logprobs(self, state: ServerState, run: OpenAIRun, index: int, progress: responses.RequestProgress,
                     track: StreamState) -> dict[str, Any] | None:
        """The logprobs of the output positions this snapshot adds (the prompt's before the
        first, for completions' echo)."""
        if run.logprobs[index] is None:
            return None
        have = len(progress.output_logprobs.token_ids) if progress.output_logprobs else 0
        first = not track.started
        if have <= track.logprobs and not (first and progress.input_logprobs is not None):
            return None
        shown = self.shaped_logprobs(state, run, index, progress, 0 if first else track.logprobs, have, track)
        track.logprobs = have
        return shown

    def shaped_logprobs(self, state: ServerState, run: OpenAIRun, index: int, progress: responses.RequestProgress,
                        start: int, end: int | None, track: StreamState | None = None) -> dict[str, Any] | None:
        raise NotImplementedError


@dataclass
class StreamState:
    """What a stream has sent of one choice."""

    offset: int = 0  # completions: the text offset of the next token's logprob (the echo's first)
    text: str = ""
    logprobs: int = 0
    started: bool = False
    tools: Any = None  # chat with tool parsing on: the choice's stream parser (tool_calls.Ling3Stream, RequiredStream)
    called: bool = False  # a tool call was sent


class ChatServing(OpenAIServing):
    """/v1/chat/completions (SGLang's serving_chat.py)."""

    path = "/v1/chat/completions"
    request_model = requests.ChatCompletionRequest
    id_prefix = "chatcmpl-"
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"
    default_max_tokens = None

    async def prompt_ids(self, state: ServerState, req: Any) -> list[list[int]]:
        if req.input_ids is not None:  # SGLang's extension: the prompt's ids, the template skipped
            return [list(req.input_ids)]
        return [await render_chat(state, req.messages, req.chat_template_kwargs, add_generation_prompt=True,
                                  tools=req.template_tools())]

    def tool_use(self, state: ServerState, req: Any) -> ToolUse:
        """The request's tools: read with the server's parser unless tool_choice is "none" or the
        answer is JSON (response_format), forced under a grammar for "required" and named."""
        parsing = bool(req.tools) and req.tool_choice != "none" and not (
            req.response_format is not None and req.response_format.json_schema_source() is not None)
        return ToolUse([ToolDef(t.function.name, t.function.parameters) for t in req.tools or []],
                       state.args.tool_call_parser if parsing else None, req.forces_a_call, req.named_tool,
                       req.parallel_tool_calls)

    def requested_max_tokens(self, req: Any) -> int | None:
        return req.requested_max_tokens()

    def logprob_request(self, state: ServerState, req: Any, ids: list[int]) -> LogprobRequest | None:
        return logprob_request(state, req.logprobs, None, req.top_logprobs_num, len(ids), "top_logprobs")

    def shaped_logprobs(self, state, run, index, progress, start, end, track=None):
        if run.logprobs[index] is None:
            return None
        part = responses.slice_logprobs(progress.output_logprobs, start, end)
        return responses.chat_logprobs(part, state.token_texts, run.logprobs[index].top)

    def choice(self, state, run, index, progress):
        return responses.chat_choice(progress, index, logprobs=self.shaped_logprobs(state, run, index, progress, 0, None),
                                     tools=run.tools.read(progress.text) if progress.finished else None)

    def stream_chunks(self, state, run, index, progress, track):
        chunks = []
        if not track.started:
            chunks.append(self._chunk(run, [responses.chat_stream_choice(index, {"role": "assistant", "content": ""})]))
            track.tools = run.tools.stream()
        shown = self.new_logprobs(state, run, index, progress, track)
        track.started = True
        delta = progress.text[len(track.text):] if progress.text.startswith(track.text) else ""
        track.text = progress.text if delta else track.text
        deltas = [{"content": delta}] if delta else []
        if track.tools is not None:
            deltas = self.tool_deltas(track, delta, progress)
        for i, shaped in enumerate(deltas or ([{"content": ""}] if shown else [])):
            chunks.append(self._chunk(run, [responses.chat_stream_choice(index, shaped, logprobs=shown if i == 0 else None)]))
        return chunks

    @staticmethod
    def tool_deltas(track: StreamState, delta: str, progress: responses.RequestProgress) -> list[dict[str, Any]]:
        """A step's text through the choice's tool-call parser: content, then each call piece
        (SGLang's _process_tool_call_stream; at the end the parser is flushed and the arguments
        it parsed but did not stream are sent, as its _check_for_unstreamed_tool_args)."""
        content, calls = track.tools.feed(delta)
        if progress.finished and (progress.finish_reason or {}).get("type") != "abort":
            more, end_calls = track.tools.end()
            content, calls = content + more, calls + end_calls
            rest = track.tools.unstreamed()
            calls += [rest] if rest is not None else []
        track.called = track.called or bool(calls)
        return ([{"content": content}] if content else []) + [responses.tool_call_delta(c) for c in calls]

    def closing(self, run, results):
        """SGLang sends every choice's finish_reason after the last one finished, then the rest."""
        finishes = [self._chunk(run, [responses.chat_stream_choice(
            k, {}, progress.finish_reason, called=run.streams[k].called if k in run.streams else False)])
            for k, progress in enumerate(results)]
        return finishes + super().closing(run, results)


class CompletionServing(OpenAIServing):
    """/v1/completions (SGLang's serving_completions.py): one prompt or a batch of them, texts or
    token ids; with echo, each choice starts with its prompt."""

    path = "/v1/completions"
    request_model = requests.CompletionRequest
    id_prefix = "cmpl-"
    object_name = "text_completion"
    chunk_object = "text_completion"
    default_max_tokens = requests.DEFAULT_COMPLETION_MAX_TOKENS

    async def prompt_ids(self, state: ServerState, req: Any) -> list[list[int]]:
        prompts = req.prompts()
        out = []
        for i, prompt in enumerate(prompts):
            where = "prompt" if len(prompts) == 1 else f"prompt.{i}"
            out.append(list(prompt) if isinstance(prompt, list) else await encode(state, prompt, where))
        return out

    def logprob_request(self, state: ServerState, req: Any, ids: list[int]) -> LogprobRequest | None:
        # echo + logprobs: the prompt's logprobs too (what loglikelihood evaluation reads), as SGLang
        start = 0 if req.echo and req.logprobs is not None else None
        return logprob_request(state, req.logprobs is not None, start, req.logprobs or 0, len(ids), "logprobs")

    def echo(self, state: ServerState, run: OpenAIRun, index: int) -> str:
        """The prompt of choice `index`, as SGLang echoes it (token ids decoded without specials)."""
        if not run.req.echo:
            return ""
        prompt = run.req.prompts()[index // run.n]
        return prompt if isinstance(prompt, str) else state.tokenizer.decode(prompt, skip_special_tokens=True)

    def shaped_logprobs(self, state, run, index, progress, start, end, track=None):
        want = run.logprobs[index]
        if want is None:
            return None
        part = responses.slice_logprobs(progress.output_logprobs, start, end)
        parts = [progress.input_logprobs] if start == 0 and progress.input_logprobs is not None else []
        shown, after = responses.completion_logprobs(parts + [part], state.token_texts, want.top, track.offset if track else 0)
        if track is not None:
            track.offset = after
        return shown

    def choice(self, state, run, index, progress):
        return responses.completion_choice(progress, index, echo=self.echo(state, run, index),
                                           logprobs=self.shaped_logprobs(state, run, index, progress, 0, None))

    def stream_chunks(self, state, run, index, progress, track):
        echo = "" if track.started else self.echo(state, run, index)
        shown = self.new_logprobs(state, run, index, progress, track)
        track.started = True
        delta = progress.text[len(track.text):] if progress.text.startswith(track.text) else ""
        track.text = progress.text if delta else track.text
        if echo or delta or shown or progress.finished:  # the finish rides on the choice's last chunk, as SGLang's
            return [self._chunk(run, [responses.completion_stream_choice(index, echo + delta, progress.finish_reason, logprobs=shown)])]
        return []


chat_completions = ChatServing().handle
completions = CompletionServing().handle

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
    is not running included (SGLang does the same). A batch's items are aborted by its rid."""
    state = _state(request)
    body = await parse(request, state, requests.AbortRequest, "/abort_request", [])
    if body.abort_all and not state.api_key:  # with a key, BearerAuth let only its holders this far
        raise requests.ApiError(403, "abort_all stops every client's requests: only a holder of the server's API key may "
                                f"(start it with ${API_KEY_ENV} set); abort your own request by its rid", type="ForbiddenError",
                                param="abort_all")
    targets = [job for rid, job in state.live_jobs.items() if body.abort_all or (body.rid and aborts(state, body.rid, job))]
    for job in targets:
        job.cancel.set()
    return Response(status_code=200)


def aborts(state: ServerState, given: str, job: Job) -> bool:
    """Whether aborting `given` aborts `job`. SGLang's scheduler aborts every request whose rid
    starts with the one given; on a server without a key anyone may call this, and a prefix
    ("chatcmpl-") would stop every other client's requests. There, a caller aborts only what it
    can name: a request's own rid (all its prompts and samples) or one job's, exactly; the rids
    the server makes are random (uuid4), so only the client that got one can name it. A holder of
    the server's key (every caller, when it has one) aborts by prefix, as in SGLang."""
    if state.api_key:
        return job.rid.startswith(given)
    return given in (job.rid, job.group)


async def tokenize(request: Request) -> Response:
    """SGLang's /tokenize (and /v1/tokenize): {"tokens", "count", "max_model_len"}."""
    state = _state(request)
    req: requests.TokenizeRequest = await parse(request, state, requests.TokenizeRequest, request.url.path, [])
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
    req: requests.DetokenizeRequest = await parse(request, state, requests.DetokenizeRequest, request.url.path, [])
    check_model(state, req.model)
    require_ready(state)
    batches = req.tokens if req.tokens and isinstance(req.tokens[0], list) else [req.tokens]
    for ids in batches:
        if state.vocab_size and any(not 0 <= i < state.vocab_size for i in ids):
            raise requests.ApiError(400, f"tokens: every id must be an integer in [0, {state.vocab_size})", param="tokens")
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
        "effective_max_running_requests_per_dp": state.engine.max_running if state.engine is not None else None,
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
        raise requests.ApiError(400, f"the request body is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise requests.ApiError(400, "the request body is not a JSON object")
    return body


PROFILE_DIR_HEADER = "x-sparkit-profile-dir"


async def start_profile(request: Request) -> Response:
    """SGLang's /start_profile: a torch.profiler trace of the next forward passes
    (sparkit.engines.embedded.profiling), written in the server's profile directory, never where
    the request says (its output_dir is ignored and named so); the directory is in a header."""
    from sparkit.engines.embedded.profiling import ProfileRequest, profile_dir

    state = _state(request)
    worker = require_ready(state)
    body = await _profile_body(request, state)
    req = ProfileRequest.from_body(body)
    try:
        where = await asyncio.to_thread(profile_dir)
    except OSError as exc:
        raise requests.ApiError(500, f"the server's profile directory is unusable: {exc}", type="InternalServerError") from None
    worker.profile.start(req)
    worker.wake()
    response = PlainTextResponse("Start profiling.\n")
    # the whole path, percent-encoded (a header is latin-1 without controls; a path is any bytes and
    # can be long): header_safe shortened a long one and the client waited on a directory that is not there
    response.headers[PROFILE_DIR_HEADER] = urllib.parse.quote(os.fsencode(where), safe="/")
    return with_ignored(response, ["output_dir"] if body.get("output_dir") else [])


async def stop_profile(request: Request) -> Response:
    """SGLang's /stop_profile: stops the profile and writes its trace (returns once written)."""
    state = _state(request)
    worker = require_ready(state)
    worker.profile.stop()
    worker.wake()
    await asyncio.to_thread(worker.profile.done.wait, 120)
    if worker.profile.error:
        raise requests.ApiError(500, f"the profile could not be written: {worker.profile.error}", type="InternalServerError")
    return PlainTextResponse("Stop profiling. This will take some time.\n")


# -- Ollama's API, as SGLang 0.5.23 serves it (sglang/srt/entrypoints/ollama/serving.py) -------------


def check_ollama_model(state: ServerState, name: str) -> None:
    """Ollama answers a model it does not have with a 404 and {"error": ...}; "NAME:latest" is NAME."""
    if not (state.accepts_model(name) or (name.endswith(":latest") and state.accepts_model(name[: -len(":latest")]))):
        raise OllamaError(404, f'model "{name}" not found, try pulling it first (this server serves "{state.served_name}")')


class OllamaError(Exception):
    """An error Ollama's way: {"error": message} with a status (what the ollama client reads)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


async def ollama_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, OllamaError)
    return JSONResponse({"error": exc.message}, status_code=exc.status)


async def ollama_chat(request: Request) -> Response:
    state = _state(request)
    ignored: list[str] = []
    req: requests.OllamaChatRequest = await parse(request, state, requests.OllamaChatRequest, "/api/chat", ignored)
    check_ollama_model(state, req.model)
    require_ready(state)
    ids = await render_chat(state, req.messages, None, add_generation_prompt=True, tools=req.template_tools())
    tools = ToolUse([ToolDef(t.function.name, t.function.parameters) for t in req.tools or []],
                    state.args.tool_call_parser if req.tools else None)
    return with_ignored(await ollama_respond(state, "chat", req, ids, request, tools), ignored + req.unread())


async def ollama_generate(request: Request) -> Response:
    state = _state(request)
    ignored: list[str] = []
    req: requests.OllamaGenerateRequest = await parse(request, state, requests.OllamaGenerateRequest, "/api/generate", ignored)
    check_ollama_model(state, req.model)
    require_ready(state)
    prompt = f"{req.system}\n\n{req.prompt}" if req.system else req.prompt
    if not prompt.strip():  # SGLang: the Ollama CLI sends an empty request when it starts; done at once
        body = responses.ollama_reply("generate", state.served_name, "", done=True, whole=not req.stream)
        if req.stream:
            return with_ignored(Response(json.dumps(body) + "\n", media_type="application/x-ndjson"), ignored + req.unread())
        return with_ignored(JSONResponse(body), ignored + req.unread())
    ids = await encode(state, prompt, "prompt")
    return with_ignored(await ollama_respond(state, "generate", req, ids, request), ignored + req.unread())


async def ollama_respond(state: ServerState, kind: str, req: Any, ids: list[int], request: Request,
                         tools: ToolUse | None = None) -> Response:
    """An /api/chat or /api/generate reply, whole or streamed; with `tools` (a chat's), the calls
    the server's parser reads go in the message's tool_calls, Ollama's shape."""
    started = time.time_ns()
    tools = tools or ToolUse()
    sp = req.sampling_params()
    max_new = check_prompt(state, ids, sp.max_new_tokens, None, field="options.num_predict")
    grammar = await compile_grammar(state, sp, request, field="format")
    params = sampling(state, sp, max_new_tokens=max_new, min_new_tokens=0, seed=sp.sampling_seed, grammar=grammar)
    job = new_job(ids, params, sp.stop_list(), no_stop_trim=False, skip_special=True, stream=req.stream, rid=None,
                  limits=state.request_limits())
    model = state.served_name
    if not req.stream:
        progress = await run_to_end(state, job, request)
        content, calls = tools.read(progress.text) or (progress.text, [])
        calls = [ToolCallItem(i, call.name, call.parameters) for i, call in enumerate(calls)]  # Ollama's index: the ordinal
        return JSONResponse(responses.ollama_reply(kind, model, content, done=True, whole=True, progress=progress,
                                                   total_ns=time.time_ns() - started, calls=calls))
    state.submit(job)

    async def body():
        sent = ""
        calls = OllamaCalls(tools.stream())
        try:
            async for progress in updates(state, job):
                delta = progress.text[len(sent):] if progress.text.startswith(sent) else ""
                sent = progress.text if delta else sent
                # SGLang's last line is `done` with no text, dropping the final step's delta; it
                # goes in a line of its own here, so that the streamed text is the whole reply
                delta, complete = calls.feed(delta, progress.finished)
                if delta or complete:
                    line = responses.ollama_reply(kind, model, delta, done=False, calls=complete)
                    yield (json.dumps(line) + "\n").encode()
                if progress.finished:
                    final = responses.ollama_reply(kind, model, "", done=True, progress=progress,
                                                   total_ns=time.time_ns() - started)
                    yield (json.dumps(final) + "\n").encode()
        except requests.ApiError as exc:
            yield (json.dumps({"error": exc.message}) + "\n").encode()

    return JobStream(body(), job, media_type="application/x-ndjson")


@dataclass
class OllamaCalls:
    """A streamed Ollama chat through the tool-call parser: content as it comes, each call whole
    once its closing tag is in (Ollama sends a call in one line, never in pieces), with the
    arguments and the tools a whole reply's parse gives (a call left open, or of a tool the request
    does not have, is dropped, as there)."""

    parser: Any  # tool_calls.Ling3Stream or None (no parsing)
    sent: int = 0  # calls the parser closed that went out (or were dropped)
    kept: int = 0  # calls that went out: the next one's index

    def feed(self, delta: str, finished: bool) -> tuple[str, list[ToolCallItem]]:
        if self.parser is None:
            return delta, []
        content, _ = self.parser.feed(delta)
        closed = -1
        while self.parser.tool_id != closed:  # it closes one call per chunk; the chunk may hold more
            closed = self.parser.tool_id
            content += self.parser.feed("")[0]
        if finished:
            content += self.parser.end()[0]
        names = {tool.name for tool in self.parser.tools}
        closed = []
        while self.sent < self.parser.tool_id:
            call = self.parser.prev_calls[self.sent]
            if call.get("name") in names:
                closed.append(ToolCallItem(self.kept, call["name"], json.dumps(call.get("arguments") or {}, ensure_ascii=False)))
                self.kept += 1
            self.sent += 1
        return content, closed


OLLAMA_DIGEST = "sha256:sglang0000000000000000000000000000000000000000000000000000000000"


async def ollama_tags(request: Request) -> Response:
    state = _state(request)
    name = state.served_name
    family = name.split("/")[-1]
    return JSONResponse({"models": [{"name": name, "model": name, "modified_at": responses.ollama_timestamp(), "size": 0,
                                     "digest": OLLAMA_DIGEST,
                                     "details": {"format": "sglang", "family": family, "parameter_size": "unknown"}}]})


async def ollama_version(request: Request) -> Response:
    """Ollama's /api/version (SGLang 0.5.23 has none): this server's version, which is sparkit's."""
    from sparkit._version import __version__

    return JSONResponse({"version": __version__})


async def ollama_ps(request: Request) -> Response:
    """Ollama's /api/ps: the models loaded now, the served one (never unloaded: it expires never)."""
    state = _state(request)
    worker = state.worker
    if worker is None or not worker.ready:
        return JSONResponse({"models": []})
    name = state.served_name
    return JSONResponse({"models": [{
        "name": name, "model": name, "size": 0, "digest": OLLAMA_DIGEST,
        "details": {"parent_model": "", "format": "sglang", "family": name.split("/")[-1], "families": [name.split("/")[-1]],
                    "parameter_size": "unknown", "quantization_level": ""},
        "expires_at": "2318-01-01T00:00:00Z", "size_vram": 0, "context_length": state.context_length}]})


async def ollama_show(request: Request) -> Response:
    """SGLang's /api/show, described by the served model's context length; another model is
    Ollama's 404 (SGLang's describes whatever model is named)."""
    state = _state(request)
    req: requests.OllamaShowRequest = await parse(request, state, requests.OllamaShowRequest, "/api/show", [])
    check_ollama_model(state, req.model)
    family = req.model.split("/")[-1]
    for suffix in ("-Instruct", "-Chat", "-Base"):
        if family.endswith(suffix):
            family = family[: -len(suffix)]
            break
    context = state.context_length
    return JSONResponse({
        "license": "", "modelfile": f"FROM {req.model}\nPARAMETER num_ctx {context}\n", "parameters": f"num_ctx {context}",
        "template": "", "modified_at": responses.ollama_timestamp(),
        "details": {"parent_model": "", "format": "sglang", "family": family, "families": [family],
                    "parameter_size": "unknown", "quantization_level": ""},
        "model_info": {"general.architecture": family, "general.name": req.model, "general.parameter_count": 0,
                       f"{family}.context_length": context, f"{family}.block_count": 0,
                       f"{family}.embedding_length": 0, f"{family}.attention.head_count": 0},
        "capabilities": ["completion"],
    })


# -- the rest of SGLang's small routes ----------------------------------------------------------------


async def root(request: Request) -> Response:
    """GET and HEAD /: SGLang's answer (a JSON string)."""
    return JSONResponse("SGLang is running")


async def ping(request: Request) -> Response:
    """SageMaker's health check, as SGLang serves it: 200 when the engine is up, else 503."""
    worker = _state(request).worker
    return Response(status_code=200 if worker is not None and worker.ready else 503)


async def embeddings(request: Request) -> Response:
    """/v1/embeddings and /encode: tiny-ling is a generation model, and SGLang refuses an
    embedding request to one (its BailingMoe classes have no pooler, --is-embedding or not)."""
    state = _state(request)
    await read_body(request, state)
    raise requests.ApiError(400, "This model does not appear to be an embedding model by default. Please add `--is-embedding` "
                            "when launching the server or try another model. (SGLang's answer for this model; tiny-ling "
                            "is a causal LM with no pooling head, so the embedded engine serves no embeddings.)",
                            param="input")


ROUTES = [
    Route("/", root, methods=["GET", "HEAD"]),
    Route("/ping", ping, methods=["GET"]),
    Route("/health", health, methods=["GET", "HEAD"]),
    Route("/health_generate", health_generate, methods=["GET"]),
    Route("/ready", health, methods=["GET"]),
    Route("/generate", generate, methods=["POST", "PUT"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/invocations", chat_completions, methods=["POST"]),  # SageMaker's name for it, as in SGLang
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    Route("/encode", embeddings, methods=["POST", "PUT"]),
    Route("/api/chat", ollama_chat, methods=["POST"]),
    Route("/api/generate", ollama_generate, methods=["POST"]),
    Route("/api/tags", ollama_tags, methods=["GET"]),
    Route("/api/show", ollama_show, methods=["POST"]),
    Route("/api/version", ollama_version, methods=["GET"]),
    Route("/api/ps", ollama_ps, methods=["GET"]),
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
    # SGLang 0.5.23 takes GET too for these three; a GET is what a web page's <img> or no-cors fetch
    # sends without an Origin header, so here each is POST only (issue 40, item 4)
    Route("/flush_cache", flush_cache, methods=["POST"]),
    Route("/start_profile", start_profile, methods=["POST"]),
    Route("/stop_profile", stop_profile, methods=["POST"]),
]


def _not_served(reason: str, *paths: str) -> dict[str, str]:
    return {path: reason for path in paths}


# The routes SGLang 0.5.23 serves (sglang/srt/entrypoints/http_server.py) that this server does not,
# and why (a 404 here). tests/embedded_server/test_routes_in_process.py reads the installed sglang's
# routes and fails on one that is neither served nor listed.
SGLANG_ROUTES_NOT_SERVED: dict[str, str] = {
    **_not_served("RL weight sync and remote weight transfer: the engine loads its checkpoint once",
                  "/update_weights_from_disk", "/update_weights_from_tensor", "/update_weights_from_distributed",
                  "/update_weights_from_ipc", "/init_weights_update_group", "/destroy_weights_update_group",
                  "/begin_weight_update", "/end_weight_update", "/update_weight_version", "/get_weights_by_name",
                  "/weights_checker", "/release_memory_occupation", "/resume_memory_occupation",
                  "/init_weights_send_group_for_remote_instance", "/send_weights_to_remote_instance",
                  "/get_remote_instance_transfer_engine_info", "/remote_instance_transfer_engine_info"),
    **_not_served("no LoRA adapters (lora_path is a 400)", "/load_lora_adapter", "/load_lora_adapter_from_tensors",
                  "/unload_lora_adapter"),
    **_not_served("no session KV cache (session_params is a 400)", "/open_session", "/close_session"),
    **_not_served("profiling and debugging hooks of SGLang's scheduler processes",
                  "/set_trace_level", "/freeze_gc", "/configure_logging", "/slow_down", "/dumper/{method}",
                  "/start_expert_distribution_record", "/stop_expert_distribution_record",
                  "/dump_expert_distribution_record"),
    **_not_served("no hierarchical or prefix cache, no retrieval corpora", "/hicache/storage-backend",
                  "/hicache/storage-backend/clear", "/get_hicache_l3_cache_layout", "/add_external_corpus",
                  "/remove_external_corpus", "/list_external_corpora"),
    **_not_served("one process: no prefill/decode disaggregation, pausing or live reconfiguration", "/pd_role_switch",
                  "/pause_generation", "/continue_generation", "/set_internal_state"),
    **_not_served("tool-call and reasoning parsers: tiny-ling has neither (tools are a 400)", "/parse_function_call",
                  "/separate_reasoning"),
    **_not_served("the Responses API keeps tool and reasoning state the engine does not have", "/v1/responses",
                  "/v1/responses/{response_id}", "/v1/responses/{response_id}/cancel"),
    **_not_served("the Anthropic Messages API: not asked for", "/v1/messages", "/v1/messages/count_tokens"),
    **_not_served("scoring APIs over label-token logprobs: not asked for (/generate's logprobs give the same numbers)",
                  "/v1/score", "/v1/decisions", "/v1/systemone"),
    **_not_served("need a cross-encoder or classification head, which tiny-ling does not have", "/v1/rerank",
                  "/v1/classify", "/classify"),
    **_not_served("need an audio model", "/v1/audio/transcriptions", "/v1/realtime"),
    **_not_served("Vertex AI's wrapper of /generate: not asked for", "/vertex_generate"),
}


async def api_error(request: Request, exc: Exception) -> Response:
    return error(exc, request.url.path)  # type: ignore[arg-type]

async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kinds = {404: "NotFoundError", 405: "MethodNotAllowed"}
    message = f"{request.method} {request.url.path}: {exc.detail}"
    body = responses.error_body(exc.status_code, message, type=kinds.get(exc.status_code, "BadRequestError"),
                                nested=request.url.path in NESTED_ERROR_PATHS)
    return JSONResponse(body, status_code=exc.status_code)

async def client_gone(request: Request, exc: Exception) -> Response:
    """The client closed the connection mid-body: nobody to answer, nothing to log."""
    return Response(status_code=499)

async def internal_error(request: Request, exc: Exception) -> Response:
    traceback.print_exception(exc, file=sys.stderr)
    body = responses.error_body(500, f"internal error: {type(exc).__name__}: {exc}", type="InternalServerError",
                                nested=request.url.path in NESTED_ERROR_PATHS)
    return JSONResponse(body, status_code=500)


def create_app(state: ServerState, inner: Any = None) -> Any:
    """The Starlette app over `state` (its routes find it as request.app.state.sparkit); `inner`
    wraps it inside the authentication (main puts the body gate there: sparkit.engines.embedded.gate)."""
    app = Starlette(
        routes=ROUTES,
        exception_handlers={requests.ApiError: api_error, OllamaError: ollama_error, HTTPException: http_error,
                            ClientDisconnect: client_gone, Exception: internal_error},
    )
    app.state.sparkit = state
    served = inner(app) if inner is not None else app
    return BearerAuth(served, state.api_key) if state.api_key else served


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
        body = json.dumps(responses.error_body(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", type="AuthenticationError")).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
