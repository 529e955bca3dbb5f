"""One file's bytes from the hub into its partial download: ranged, resumed when the connection
drops, never past the file's listed size, and stoppable at once from another thread.

huggingface_hub's `http_get` reads its body 10 MiB at a time (`iter_bytes(chunk_size=...)`): a
file object it writes to sees nothing until 10 MiB arrived, so a body that trickles a byte every
few seconds could not be stopped (Ctrl-C waited 431 s), a 112-byte file could grow a 1 GiB
`.incomplete` before its size was checked, and a kill lost up to 10 MiB of what had arrived. Here
the body is read as it arrives, through huggingface_hub's own session (its token, its proxies, its
error classes):

- each piece goes to disk as it comes (a kill loses nothing that reached the machine) and into the
  hash; a Content-Length, or a byte, past the listed size stops the file before it is written
  (`TooLong`);
- a connection that drops, or a body that ends early, is resumed with a Range request from the
  byte the file holds, up to DROP_RETRIES times in a row without progress (huggingface_hub's own
  count), pausing RETRY_PAUSE_S between;
- a read waits at most HF_HUB_DOWNLOAD_TIMEOUT for the next byte (huggingface_hub's setting);
- `Hangups.hang_up_all()`, called from any thread, shuts down the socket of every transfer in flight:
  a read blocked on a silent or trickling server returns at once and the transfer raises `Stopped`.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Callable
from typing import Any

from sparkit.errors import HubError
from sparkit.hub import untrusted
from sparkit.hub.remote import transport_errors

DROP_RETRIES = 5
RETRY_PAUSE_S = 1.0
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class Stopped(Exception):
    """Cancelled (Ctrl-C, or another file failed): the partial download stays for the next pull."""


class TooLong(Exception):
    """The hub sent, or announced, more bytes than the file's listed size."""

    def __init__(self, how: str):
        super().__init__(how)
        self.how = how


class Dropped(ConnectionError):
    """The connection dropped (or the body ended early) DROP_RETRIES times in a row without a byte."""


class Hangups:
    """The sockets of the transfers in flight, by thread, for another thread to shut down."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: dict[int, socket.socket] = {}
        self.hung_up = threading.Event()

    def hold(self, response: Any) -> None:
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None:
            return
        with self._lock:
            self._sockets[threading.get_ident()] = sock
        if self.hung_up.is_set():  # hung up between the check and the registration
            _shut(sock)

    def release(self) -> None:
        with self._lock:
            self._sockets.pop(threading.get_ident(), None)

    def hang_up_all(self) -> None:
        self.hung_up.set()
        with self._lock:
            held = list(self._sockets.values())
        for sock in held:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:  # the plain socket's shutdown, under TLS too: the reader's SSL object stays whole
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


class Body:
    """Where a transfer's bytes go: appended to the partial download (opened at the byte it holds),
    hashed as they arrive, counted, and refused past `size`."""

    def __init__(self, handle: Any, size: int, held: int, hasher: Any, new_hasher: Callable[[], Any],
                 on_bytes: Callable[[int], None], cancel: threading.Event,
                 on_restart: Callable[[], None] = lambda: None):
        self.handle, self.size, self.written, self.hasher = handle, size, held, hasher
        self.new_hasher, self.on_bytes, self.on_restart, self.cancel = new_hasher, on_bytes, on_restart, cancel

    def write(self, chunk: bytes) -> None:
        if self.cancel.is_set():
            raise Stopped
        if self.written + len(chunk) > self.size:
            raise TooLong(f"at least {self.written + len(chunk)} bytes")
        view = memoryview(chunk)
        while view:  # an unbuffered file: each write is the kernel's, and may be short
            view = view[self.handle.write(view):]
        self.hasher.update(chunk)
        self.written += len(chunk)
        self.on_bytes(len(chunk))

    def restart(self) -> None:
        """The server sent the whole file to a Range request: what is held is dropped, the hash starts over."""
        self.handle.seek(0)
        self.handle.truncate(0)
        self.written, self.hasher = 0, self.new_hasher()
        self.on_restart()


def fetch(location: str, headers: dict[str, str], body: Body, *, hangups: Hangups, cancel: threading.Event,
          on_drop: Callable[[BaseException], None], timeout: float | None) -> None:
    """GET `location` into `body` until it holds the file's listed size. Raises Stopped, TooLong,
    Dropped, huggingface_hub's HfHubHTTPError for the hub's 4xx/5xx, HubError for an answer no
    hub gives, OSError for the disk."""
    from huggingface_hub.utils import get_session, hf_raise_for_status

    failures = 0
    while body.written < body.size:
        start = body.written
        asked = {**headers, "Accept-Encoding": "identity", **({"Range": f"bytes={start}-"} if start else {})}
        try:
            if cancel.is_set():
                raise Stopped
            with get_session().stream("GET", location, headers=asked, timeout=timeout) as response:
                hangups.hold(response)
                try:
                    hf_raise_for_status(response)
                    _check_answer(response, start, body, location)
                    for chunk in response.iter_bytes():
                        body.write(chunk)
                finally:
                    hangups.release()
        except (Stopped, TooLong, HubError):
            raise
        except Exception as exc:
            if cancel.is_set():
                raise Stopped from None
            if not _is_transport(exc):
                raise
            failures = 0 if body.written > start else failures + 1
            if failures > DROP_RETRIES:
                raise Dropped(_reason(exc)) from None
            on_drop(exc)
            if cancel.wait(RETRY_PAUSE_S):
                raise Stopped from None
            continue
        if body.written >= body.size:
            return
        failures = 0 if body.written > start else failures + 1  # the body ended early: as a drop
        short = ConnectionError(f"the hub sent {body.written} of the file's {body.size} bytes")
        if failures > DROP_RETRIES:
            raise Dropped(str(short))
        on_drop(short)
        if cancel.wait(RETRY_PAUSE_S):
            raise Stopped


def _check_answer(response: Any, start: int, body: Body, location: str) -> None:
    """The answer to a GET from byte `start` is the file from there: a Range answered with the
    whole file starts over; a range that is not the one asked for, or a length past the listed
    size, is refused before a byte of the body is read."""
    if start and response.status_code == 200:
        body.restart()
    elif start and response.status_code == 206:
        found = _CONTENT_RANGE.fullmatch((response.headers.get("Content-Range") or "").strip())
        if not found or int(found[1]) != start or found[3] not in ("*", str(body.size)):
            raise untrusted.refused(f"{_origin(location)} answered a request for bytes {start}- of the file",
                                    "Content-Range", response.headers.get("Content-Range"),
                                    f"that range of a {body.size}-byte file")
    length = response.headers.get("Content-Length")
    encoding = (response.headers.get("Content-Encoding") or "identity").strip().lower()
    if length is not None and encoding == "identity":  # a compressed body's length is not the file's
        if not length.strip().isdigit():
            raise untrusted.refused(f"{_origin(location)} answered", "Content-Length", length, "a length")
        if body.written + int(length) > body.size:
            raise TooLong(f"{body.written + int(length)} bytes, by its Content-Length")


def _origin(url: str) -> str:
    from urllib.parse import urlparse

    parsed = urlparse(url)
    return f"{parsed.scheme}://{parsed.netloc}"


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _is_transport(exc: BaseException) -> bool:
    return isinstance(exc, transport_errors())


__all__ = ["fetch", "Body", "Hangups", "Stopped", "TooLong", "Dropped", "DROP_RETRIES"]
