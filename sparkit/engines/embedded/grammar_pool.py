"""Grammar compiles out of the server's way (issue 40, item 2): a request's regex, JSON schema or
EBNF is compiled in a child process, never in a thread of the server, because a compile cannot be
interrupted from inside: only a process can be stopped half-way.

- Bounded in size before anything compiles (grammar.check_size: characters, schema nodes).
- At most `workers` compiles at once (--grammar-compile-workers), each in its own child process,
  and at most MAX_WAITING more waiting for one (a 503 past that); no compile runs in asyncio's
  default executor, so tokenising and templating for other clients never wait behind one.
- Each compile has --grammar-compile-timeout seconds from the moment a child takes it up; past
  that its process is killed and the request gets SGLang's "Grammar preprocessing timed out".
  A client that leaves while its grammar compiles or waits has it abandoned the same way.
- The children are forked from a multiprocessing forkserver that has xgrammar imported once
  (importing it takes seconds: torch comes with it), so replacing a killed child costs
  milliseconds, not an import. The forkserver starts with the first grammar request (a server
  never asked for one never pays for it).
- A cache (least recently used, bounded in entries and in compiled bytes) answers a grammar that
  comes back, as every request of an eval does, without compiling; a grammar that failed or timed
  out is remembered too (as SGLang remembers it), so repeating a hostile one costs nothing.

The compiled grammar comes back serialised (xgrammar's serialize_json) and is rebuilt against the
parent's tokenizer info: the matcher runs in the engine's thread, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sparkit.engines.embedded.grammar import MAX_GRAMMAR_CHARS, Grammar, GrammarError, check_size

MAX_WAITING = 64
"""Compiles waiting for a free child beyond the running ones; more are a 503."""
CACHE_ENTRIES = 512
CACHE_BYTES = 256 * 1024 * 1024
POLL_S = 0.05  # how often a waiting compile looks at its deadline and its client


def default_workers() -> int:
    """One compile at a time per four cores, at least one (a compile takes a core while it runs)."""
    import os

    return max(1, min(4, (os.cpu_count() or 1) // 4))


def _die_with_parent() -> None:
    """A compile child dies with the process that forked it (Linux's PR_SET_PDEATHSIG), so that a
    server killed with SIGKILL leaves no compile running."""
    with contextlib.suppress(Exception):
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))


def _child_main(conn: Any, info_json: str, any_whitespace: bool, max_whitespace_cnt: int | None) -> None:
    """A compile child: (kind, source) in, ("ok", serialised grammar) or ("error", message) out."""
    _die_with_parent()
    import xgrammar

    from sparkit.engines.embedded.grammar import GrammarCompiler

    info = xgrammar.TokenizerInfo.deserialize_json(info_json)
    compiler = GrammarCompiler(None, info.vocab_size, 0, any_whitespace=any_whitespace,
                               max_whitespace_cnt=max_whitespace_cnt, info=info)
    while True:
        try:
            kind, source = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(("ok", compiler.compile(kind, source).compiled.serialize_json()))
        except GrammarError as exc:
            conn.send(("error", str(exc)))
        except Exception as exc:  # noqa: BLE001 - the request's grammar broke xgrammar: its error, not ours
            conn.send(("error", f"Failed to compile {kind} grammar: {type(exc).__name__}: {exc}"))


@dataclass
class _Child:
    process: Any
    conn: Any

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
            self.process.join(5)
        with contextlib.suppress(Exception):
            self.conn.close()


@dataclass
class _Compile:
    """One compile on its way: where it stands, and the flag that abandons it."""

    kind: str
    source: str
    cancel: threading.Event = field(default_factory=threading.Event)
    started: float | None = None  # when a child took it up


class GrammarPool:
    """The server's grammar compiles (see the module docstring). `compile` is awaited by a route."""

    def __init__(self, info: Any, *, workers: int, timeout_s: float, max_chars: int = MAX_GRAMMAR_CHARS,
                 any_whitespace: bool = True, max_whitespace_cnt: int | None = None,
                 on_event: Callable[[str], None] | None = None) -> None:
        import multiprocessing

        self.info = info
        self.workers = workers
        self.timeout_s = timeout_s
        self.max_chars = max_chars
        self._child_args = (info.serialize_json(), any_whitespace, max_whitespace_cnt)
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(["xgrammar", __name__])
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grammar-compile")
        self._idle: list[_Child] = []
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], Grammar | str] = OrderedDict()
        self._cache_bytes = 0
        self.pending = 0  # compiles submitted and not yet done (running or waiting)
        self.killed = 0  # children killed: a compile past its time, or abandoned by its client
        self._on_event = on_event or (lambda _line: None)
        self._closed = False

    # -- the children
    def _new_child(self) -> _Child:
        parent, child_end = self._context.Pipe()
        process = self._context.Process(target=_child_main, args=(child_end, *self._child_args), daemon=True,
                                        name="sparkit-grammar-compile")
        process.start()
        child_end.close()
        return _Child(process, parent)

    def _take_child(self) -> _Child:
        with self._lock:
            while self._idle:
                child = self._idle.pop()
                if child.process.is_alive():
                    return child
                child.kill()
        return self._new_child()

    def close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            idle, self._idle = self._idle, []
        for child in idle:
            child.kill()

    # -- the cache
    def _cached(self, key: tuple[str, str]) -> Grammar | str | None:
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
            return found

    def _remember(self, key: tuple[str, str], value: Grammar | str) -> None:
        size = int(getattr(value.compiled, "memory_size_bytes", 0)) if isinstance(value, Grammar) else len(value)
        with self._lock:
            if key in self._cache:
                return
            self._cache[key] = value
            self._cache_bytes += size
            while len(self._cache) > CACHE_ENTRIES or self._cache_bytes > CACHE_BYTES:
                _, dropped = self._cache.popitem(last=False)
                self._cache_bytes -= (int(getattr(dropped.compiled, "memory_size_bytes", 0))
                                      if isinstance(dropped, Grammar) else len(dropped))

    # -- a compile
    async def compile(self, kind: str, source: str, client_gone: Callable[[], Awaitable[bool]]) -> Grammar:
        """The compiled grammar, or GrammarError (SGLang's message: it does not compile, it is too
        large, it timed out); GrammarPoolBusy when too many wait; ClientLeft when `client_gone`
        said so while it compiled or waited (the compile is abandoned)."""
        key = (kind, source)
        found = self._cached(key)
        if isinstance(found, Grammar):
            return found
        if isinstance(found, str):
            raise GrammarError(found)
        check_size(kind, source, self.max_chars)
        with self._lock:
            if self.pending >= self.workers + MAX_WAITING:
                raise GrammarPoolBusy(f"{self.pending} grammars are compiling or waiting to (at most {self.workers} "
                                      f"at once, --grammar-compile-workers, and {MAX_WAITING} waiting); retry later")
            self.pending += 1
        job = _Compile(kind, source)
        future = self._executor.submit(self._run, job)
        try:
            waited = asyncio.wrap_future(future)
            while True:
                done, _ = await asyncio.wait({waited}, timeout=0.25)
                if done:
                    return waited.result()
                if await client_gone():
                    job.cancel.set()
                    self._on_event("grammar: abandoned compiles whose client left (their process killed)")
                    raise ClientLeft()
        finally:
            if not future.done():
                job.cancel.set()

    def _run(self, job: _Compile) -> Grammar:
        """In a pool thread: hand the grammar to a child, wait for its answer within the limit."""
        try:
            if job.cancel.is_set() or self._closed:
                raise ClientLeft()
            found = self._cached((job.kind, job.source))  # an identical grammar ahead of it finished
            if isinstance(found, Grammar):
                return found
            if isinstance(found, str):
                raise GrammarError(found)
            child = self._take_child()
            job.started = time.monotonic()
            child.conn.send((job.kind, job.source))
            deadline = job.started + self.timeout_s
            while not child.conn.poll(POLL_S):
                if job.cancel.is_set() or time.monotonic() >= deadline:
                    child.kill()
                    with self._lock:
                        self.killed += 1
                    if job.cancel.is_set():
                        raise ClientLeft()
                    message = (f"Grammar preprocessing timed out: the {job.kind} did not compile within "
                               f"{self.timeout_s:g} s (--grammar-compile-timeout)")
                    self._on_event(f"grammar: killed compiles that ran past --grammar-compile-timeout {self.timeout_s:g} s")
                    self._remember((job.kind, job.source), message)
                    raise GrammarError(message)
            try:
                status, payload = child.conn.recv()
            except (EOFError, OSError):  # the child died (out of memory, say): the request's grammar did that
                child.kill()
                raise GrammarError(f"Failed to compile {job.kind} grammar: the compile process died") from None
            with self._lock:
                self._idle.append(child)
            if status != "ok":
                self._remember((job.kind, job.source), payload)
                raise GrammarError(payload)
            import xgrammar

            grammar = Grammar(job.kind, job.source, xgrammar.CompiledGrammar.deserialize_json(payload, self.info))
            self._remember((job.kind, job.source), grammar)
            return grammar
        finally:
            with self._lock:
                self.pending -= 1


class GrammarPoolBusy(Exception):
    """Too many compiles running and waiting: a 503."""


class ClientLeft(Exception):
    """The client left while its grammar compiled or waited; the compile was abandoned."""
