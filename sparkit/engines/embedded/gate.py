"""What stands between the embedded server's socket and its routes: the protections that hold
for every endpoint, whatever its handler does.

- `GuardedH11Protocol` (the connection): a limit on open connections, so idle clients can never
  take the server to its file limit: past it, the connection that has waited longest without a
  request in progress is closed to make room (503), and only when every one is busy is the new
  one refused (503, closed at once); and a deadline for a request's headers (a client that opens
  a connection and sends half a request is closed after --header-timeout seconds, between
  requests too).
- `RequestGate` (ASGI, outermost): the Host header must name an address the server listens on
  (a web page cannot reach a local server through DNS rebinding); a browser's Origin is refused
  unless it is the server's own or allowed (--allowed-origins / SPARKIT_ALLOWED_ORIGINS, like
  OLLAMA_ORIGINS), and an allowed one gets CORS headers; a request body must be JSON
  (`Content-Type: application/json`: a page's form or text/plain post, which browsers send
  cross-origin without asking, is refused), or have no Content-Type at all from a client that
  is no browser (no Origin, no Sec-Fetch-* headers), as litellm's Ollama providers send it.
- `BodyGate` (ASGI, after authentication): the body is read whole within --body-timeout seconds
  and --max-request-bytes, and the counts that make a request's cost (messages, stop strings
  and their length, stop token ids) are bounded before any handler parses it; a large body is
  parsed off the event loop.
- `Causes`: one log line per cause (an error repeated per connection is counted, not repeated;
  the counts close the log at shutdown), for uvicorn's per-request warnings and the event loop's
  errors (`socket.accept() out of system resource` at the file limit).

The handlers see only requests that passed; routes.py keeps its own checks (they stay right for
in-process use without these layers).
"""

from __future__ import annotations

import asyncio
import fnmatch
import ipaddress
import json
import logging
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from sparkit.engines.embedded.responses import error_body
from sparkit.engines.embedded.settings import ORIGINS_ENV

MAX_MESSAGES = 4096
"""Messages in one chat; also never more than the context has tokens (each costs one at least)."""
MAX_CONTENT_PARTS = 256
"""Parts of one message's content."""
MAX_STOP_STRINGS = 64
"""Stop strings of one request (OpenAI takes 4; each is searched for at every step)."""
MAX_STOP_CHARS = 16384
"""Characters of all stop strings of one request together."""
MAX_STOP_TOKEN_IDS = 1024
OFF_LOOP_BYTES = 64 * 1024
"""A body larger than this is parsed in a thread: /health and the other clients go on meanwhile."""

_JSON_TYPES = ("application/json",)
_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}


# -- one log line per cause ------------------------------------------------------------------------------


class Causes:
    """Counts what went wrong, by cause, and says each once: a cause that repeats per connection
    (a client flood) is one line, and the count comes with the shutdown's summary."""

    def __init__(self, emit: Any = None) -> None:
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        self.emit = emit or (lambda line: print(line, file=sys.stderr, flush=True))

    def _count(self, cause: str) -> int:
        with self.lock:
            n = self.counts.get(cause, 0) + 1
            self.counts[cause] = n
        return n

    def note(self, cause: str, line: str | None = None) -> bool:
        """Count one occurrence; True when it was said (the first)."""
        if self._count(cause) == 1:
            self.emit(line or cause)
            return True
        return False

    def summary(self) -> list[str]:
        """One line per cause that repeated, with its count (for the log at shutdown)."""
        return [f"server: {n} times in all: {cause}" for cause, n in sorted(self.counts.items()) if n > 1]

    def log_filter(self) -> logging.Filter:
        """A filter for uvicorn's logger: a message seen before is counted, not logged again."""
        causes = self

        class OncePerMessage(logging.Filter):
            def filter(self, record: logging.LogRecord) -> bool:
                cause = record.getMessage()
                if record.exc_info and record.exc_info[1] is not None:
                    cause += f" {type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
                return causes._count(cause) == 1

        return OncePerMessage()

    def loop_handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The event loop's exception handler: an OS error (the file limit at accept) is one line
        per cause; anything else gets the default report (with its traceback) once per cause."""
        exc = context.get("exception")
        message = context.get("message", "event loop error")
        if isinstance(exc, OSError):
            cause = f"{message}: {exc.strerror or exc} (errno {exc.errno})"
            self.note(cause, f"server: {cause}; new connections wait until one closes")
            return
        cause = f"{message}: {type(exc).__name__}: {exc}" if exc is not None else message
        if self._count(cause) == 1:
            loop.default_exception_handler(context)


# -- the connection --------------------------------------------------------------------------------------


@dataclass
class Limits:
    """The gate's settings (from ServerOptions: --max-connections, --header-timeout, --body-timeout,
    --max-request-bytes, --allowed-hosts, --allowed-origins)."""

    host: str
    port: int
    max_connections: int = 1024
    header_timeout_s: float = 15.0
    body_timeout_s: float = 60.0
    max_request_bytes: int = 4 * 1024 * 1024
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    causes: Causes = field(default_factory=Causes)


def _raw_response(status: int, reason: str, message: str, *, kind: str) -> bytes:
    body = json.dumps(error_body(status, message, type=kind)).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def protocol_class(limits: Limits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the connection limit and the header deadline."""

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._header_timer: asyncio.TimerHandle | None = None
            self._waiting_cycle: Any = None
            self._waiting_since = 0.0
            if len(self.connections) > limits.max_connections and not self._make_room():
                limits.causes.note("connection limit", f"server: refused connections past --max-connections "
                                   f"{limits.max_connections}, every one of them busy with a request (503, closed at once)")
                transport.write(_raw_response(503, "Service Unavailable", f"the server holds {limits.max_connections} "
                                              "connections already (--max-connections); retry later",
                                              kind="ServiceUnavailableError"))
                transport.close()
                return
            self._await_headers()

        def _waiting(self) -> bool:
            """Open, and no request of it in progress (idle, or its headers still coming)."""
            return (not self.transport.is_closing() and getattr(self, "_header_timer", None) is not None
                    and self.cycle is self._waiting_cycle)

        def _make_room(self) -> bool:
            """Past the limit, the connection that has waited longest without a request in progress
            makes room (half-sent or idle connections cannot crowd out a client that asks)."""
            idle = [c for c in self.connections if c is not self and isinstance(c, GuardedH11Protocol) and c._waiting()]
            if not idle:
                return False
            oldest = min(idle, key=lambda c: c._waiting_since)
            limits.causes.note("connection limit: idle closed", f"server: past --max-connections {limits.max_connections}, "
                               "closed the connections that waited longest without a request to make room (503)")
            oldest._cancel_header_timer()
            oldest.transport.write(_raw_response(503, "Service Unavailable", "closed to make room: the server is at its "
                                                 f"connection limit ({limits.max_connections}) and this connection sent "
                                                 "no request", kind="ServiceUnavailableError"))
            oldest.transport.close()
            self.connections.discard(oldest)
            return True

        def _await_headers(self) -> None:
            self._cancel_header_timer()
            self._waiting_cycle = self.cycle
            self._waiting_since = self.loop.time()
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._headers_late)

        def _cancel_header_timer(self) -> None:
            timer = getattr(self, "_header_timer", None)
            if timer is not None:
                timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.cycle is not self._waiting_cycle:
                return
            limits.causes.note("header timeout", f"server: closed connections whose request headers did not "
                               f"arrive within {limits.header_timeout_s:g} s (--header-timeout)")
            self.transport.write(_raw_response(408, "Request Timeout", "the request's headers did not arrive within "
                                               f"{limits.header_timeout_s:g} s", kind="RequestTimeout"))
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if getattr(self, "_header_timer", None) is not None and self.cycle is not self._waiting_cycle:
                self._cancel_header_timer()  # a request's headers are in: the body has its own deadline

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._await_headers()  # a kept-alive connection waits for the next request's headers

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_header_timer()
            super().connection_lost(exc)

    return GuardedH11Protocol


def raise_file_limit() -> int:
    """Raise this process's open-file limit to its hard limit (the connection limit then fits
    under it); returns the soft limit now in force."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        if soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        return int(soft)
    except (ImportError, ValueError, OSError):
        return 1024


# -- ASGI helpers -----------------------------------------------------------------------------------------


def _headers(scope: dict[str, Any]) -> dict[bytes, bytes]:
    return {k.lower(): v for k, v in scope.get("headers") or []}


async def _refuse(send: Any, status: int, message: str, *, kind: str, param: str | None = None,
                  extra: list[tuple[bytes, bytes]] | None = None, close: bool = False) -> None:
    body = json.dumps(error_body(status, message, type=kind, param=param)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(extra or [])]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _split_host(value: str) -> tuple[str, int | None] | None:
    """'name:port', '[::1]:port', 'name' -> (name lowercased, port or None); None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1:]
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:] if rest else ""
    else:
        name, _, port = value.partition(":") if value.count(":") <= 1 else (value, "", "")
    if port and not port.isdigit():
        return None
    return name.rstrip("."), int(port) if port else None


def _is_loopback(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_names(limits: Limits) -> set[str] | None:
    """The names a request's Host may give, or None when any is fine (the server listens on every
    address: it is as reachable by any name as by its IPs)."""
    bound = limits.host.strip("[]").lower()
    if limits.host in _WILDCARD_HOSTS or bound in _WILDCARD_HOSTS:
        return None
    names = {bound, *(h.lower().strip("[]") for h in limits.allowed_hosts)}
    if _is_loopback(bound):
        names |= _LOOPBACK_NAMES
    else:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    return names


def origin_allowed(origin: str, limits: Limits, names: set[str] | None) -> bool:
    """The server's own origin (http://NAME:PORT for a name Host may give), or one that
    --allowed-origins / SPARKIT_ALLOWED_ORIGINS lists (exactly, or as a pattern: `*`,
    `http://localhost:*`, `chrome-extension://*`)."""
    origin = origin.strip()
    for pattern in limits.allowed_origins:
        if pattern == "*" or origin == pattern or ("*" in pattern and fnmatch.fnmatchcase(origin, pattern)):
            return True
    scheme, sep, rest = origin.partition("://")
    if not sep or scheme != "http":
        return False
    parsed = _split_host(rest)
    if parsed is None:
        return False
    name, port = parsed
    return (port or 80) == limits.port and (names is None or name in names)


class RequestGate:
    """ASGI middleware, outermost: Host, Origin (and CORS for allowed ones), a JSON content type."""

    def __init__(self, app: Any, limits: Limits) -> None:
        self.app = app
        self.limits = limits
        self.names = host_names(limits)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = _headers(scope)
        host = headers.get(b"host")
        if host is not None and not self._host_ok(host.decode("latin-1")):
            self.limits.causes.note("host", "server: refused requests whose Host header names no address this server "
                                    "listens on (403; --allowed-hosts adds names)")
            return await _refuse(send, 403, f"Host {host.decode('latin-1')[:100]!r} is not an address this server listens "
                                 f"on ({self.limits.host}:{self.limits.port}); start it with --allowed-hosts NAME to "
                                 "accept another name", kind="ForbiddenError")
        origin = headers.get(b"origin")
        cors: list[tuple[bytes, bytes]] = []
        if origin is not None:
            text = origin.decode("latin-1")
            if not origin_allowed(text, self.limits, self.names):
                self.limits.causes.note("origin", "server: refused browser requests from origins not allowed (403; "
                                        f"--allowed-origins or {ORIGINS_ENV} allows them)")
                return await _refuse(send, 403, f"requests from the web origin {text[:100]!r} are not allowed: start the "
                                     f"server with --allowed-origins {text[:100]} (or set {ORIGINS_ENV})",
                                     kind="ForbiddenError")
            cors = [(b"access-control-allow-origin", origin), (b"vary", b"Origin")]
            if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
                asked = headers.get(b"access-control-request-headers", b"authorization, content-type")
                return await self._preflight(send, cors, asked)
        if (scope["method"] in ("POST", "PUT", "PATCH") and _has_body(headers) and not _is_json(headers)
                and not _from_no_browser(headers)):
            shown = headers.get(b"content-type", b"").decode("latin-1")[:80] or "none"
            return await _refuse(send, 415, f"the request body must be JSON, sent with 'Content-Type: application/json' "
                                 f"(got {shown})", kind="UnsupportedMediaType", extra=cors)
        if not cors:
            return await self.app(scope, receive, send)

        async def send_with_cors(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        return await self.app(scope, receive, send_with_cors)

    def _host_ok(self, value: str) -> bool:
        if self.names is None:
            return True
        parsed = _split_host(value)
        if parsed is None:
            return False
        name, port = parsed
        return name in self.names and port in (None, self.limits.port)

    async def _preflight(self, send: Any, cors: list[tuple[bytes, bytes]], asked: bytes) -> None:
        headers = [*cors, (b"access-control-allow-methods", b"GET, POST, PUT, OPTIONS"),
                   (b"access-control-allow-headers", asked[:1000]), (b"access-control-max-age", b"600"),
                   (b"content-length", b"0")]
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


def _has_body(headers: dict[bytes, bytes]) -> bool:
    length = headers.get(b"content-length", b"").strip()
    return (length.isdigit() and int(length) > 0) or b"transfer-encoding" in headers


def _from_no_browser(headers: dict[bytes, bytes]) -> bool:
    """A body with no Content-Type at all, from a client that is no browser: litellm's Ollama
    providers send JSON so, as real Ollama and SGLang's /api/* accept it. A browser sends an
    Origin with every POST (a page's no-cors fetch of a typeless Blob included) and Sec-Fetch-*
    headers; a request with either still needs the JSON type."""
    return (b"content-type" not in headers and b"origin" not in headers
            and not any(name.startswith(b"sec-fetch-") for name in headers))


def _is_json(headers: dict[bytes, bytes]) -> bool:
    kind = headers.get(b"content-type", b"").decode("latin-1").split(";", 1)[0].strip().lower()
    return kind in _JSON_TYPES or (kind.startswith("application/") and kind.endswith("+json"))


class BodyGate:
    """ASGI middleware, after authentication: the whole body within the deadline and the size
    limit, its costly counts bounded (sparkit.engines.embedded.gate.request_bounds), then handed
    on as if just received."""

    def __init__(self, app: Any, limits: Limits, context_length: Any) -> None:
        self.app = app
        self.limits = limits
        self.context_length = context_length  # a callable: known once the engine has loaded

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        limit = self.limits.max_request_bytes
        declared = _headers(scope).get(b"content-length", b"").strip()
        if declared.isdigit() and int(declared) > limit:
            return await _refuse(send, 413, f"the request body ({int(declared)} bytes) exceeds the server's limit of "
                                 f"{limit} bytes (--max-request-bytes)", kind="RequestTooLarge", close=True)
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + self.limits.body_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                self.limits.causes.note("body timeout", "server: answered 408 to requests whose body did not arrive "
                                        f"within {self.limits.body_timeout_s:g} s (--body-timeout)")
                return await _refuse(send, 408, f"the request body did not arrive within {self.limits.body_timeout_s:g} s",
                                     kind="RequestTimeout", close=True)
            if message["type"] == "http.disconnect":
                return  # the client left mid-body: nobody to answer
            size += len(message.get("body", b""))
            if size > limit:
                return await _refuse(send, 413, f"the request body exceeds the server's limit of {limit} bytes "
                                     "(--max-request-bytes)", kind="RequestTooLarge", close=True)
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        problem = await self._bounded(body, scope["path"])
        if problem is not None:
            message_text, param = problem
            return await _refuse(send, 400, f"{scope['path']}: {message_text}", kind="BadRequestError", param=param)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls: the client leaving (http.disconnect)

        return await self.app(scope, replay, send)

    async def _bounded(self, body: bytes, path: str) -> tuple[str, str | None] | None:
        if not body.strip():
            return None
        context = self.context_length() or 0
        if len(body) > OFF_LOOP_BYTES:
            return await asyncio.to_thread(request_bounds, body, context)
        return request_bounds(body, context)


def request_bounds(body: bytes, context_length: int) -> tuple[str, str | None] | None:
    """(why, field) when a JSON body asks for more than any request may (messages, content parts,
    stop strings and their length, stop token ids), else None; a body that is no JSON is left to
    the handler's parser, which names the problem."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    stop_strings = stop_chars = 0
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        node, where, depth = stack.pop()
        if depth > 4:
            continue
        if isinstance(node, list) and (not node or not isinstance(node[0], (dict, list))):
            continue  # a list of numbers or text (input_ids, a prompt batch): nothing below it to bound
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            at = f"{where}.{key}" if where else str(key)
            if key == "messages" and isinstance(value, list):
                most = min(MAX_MESSAGES, context_length) if context_length else MAX_MESSAGES
                if len(value) > most:
                    return (f"{at}: {len(value)} messages; this server takes at most {most} in one request"
                            + (f" (the model's context is {context_length} tokens, and each message takes one at least)"
                               if most == context_length else ""), at)
                for i, message in enumerate(value):
                    content = message.get("content") if isinstance(message, dict) else None
                    if isinstance(content, list) and len(content) > MAX_CONTENT_PARTS:
                        return (f"{at}.{i}.content: {len(content)} parts; at most {MAX_CONTENT_PARTS}", f"{at}.{i}.content")
                continue  # a message's own keys are no request's fields
            if key == "stop" and isinstance(value, (str, list)):
                stops = [value] if isinstance(value, str) else value
                stop_strings += len(stops)
                stop_chars += sum(len(s) for s in stops if isinstance(s, str))
                if stop_strings > MAX_STOP_STRINGS:
                    return (f"{at}: {stop_strings} stop strings; at most {MAX_STOP_STRINGS} in one request (each is "
                            "looked for after every token)", at)
                if stop_chars > MAX_STOP_CHARS:
                    return (f"{at}: the stop strings hold {stop_chars} characters; at most {MAX_STOP_CHARS} in one "
                            "request", at)
                continue
            if key == "stop_token_ids" and isinstance(value, list) and len(value) > MAX_STOP_TOKEN_IDS:
                return f"{at}: {len(value)} stop token ids; at most {MAX_STOP_TOKEN_IDS}", at
            if isinstance(value, (dict, list)):
                stack.append((value, at, depth + 1))
    return None
