"""The worker thread: loads the engine, warms it up, then runs the scheduler (scheduler.py:
continuous batching, --max-running-requests at once, first come first served, chunked prefill)
until the server stops. The engine is called from this one thread only, so it needs no locking."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkit.engines.embedded.api import LogprobRequest, SamplingParams
from sparkit.engines.embedded.profiling import ProfileControl
from sparkit.engines.embedded.requests import ApiError
from sparkit.engines.embedded.responses import RequestProgress
from sparkit.engines.embedded.scheduler import Scheduler, find_stop, log, stable_text  # noqa: F401 (re-exported)
from sparkit.engines.embedded.server_metrics import ServerMetrics

_WAKE = object()  # put on the job queue so that an idle worker acts on a profile request

# -- the worker -----------------------------------------------------------------------------------


@dataclass
class RequestLimits:
    """One request's share of the engine, shared by its jobs (prompts x n samples): how long it may
    wait before it starts and run once started (--request-waiting-timeout, --request-running-timeout;
    None: no limit), and when its first job started."""

    running_s: float | None = None
    waiting_s: float | None = None
    started: float | None = None

    def over(self, now: float, arrived: float) -> str | None:
        """SGLang's message when the request is past one of its limits, else None."""
        if self.started is None:
            if self.waiting_s is not None and now - arrived > self.waiting_s:
                return f"Request waiting timeout reached. (--request-waiting-timeout {self.waiting_s:g} s)"
            return None
        if self.running_s is not None and now - self.started > self.running_s:
            return f"Request running timeout reached. (--request-running-timeout {self.running_s:g} s)"
        return None


@dataclass
class Job:
    """One request on its way through the worker. `updates` lives on the event loop."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    stops: list[str]
    no_stop_trim: bool
    skip_special_tokens: bool
    stream: bool
    loop: asyncio.AbstractEventLoop
    updates: asyncio.Queue
    cancel: threading.Event = field(default_factory=threading.Event)
    internal: bool = False  # warm-up / health_generate: not counted in metrics
    logprobs: LogprobRequest | None = None
    arrived: float = field(default_factory=time.perf_counter)
    group: str | None = None  # the rid of the request it is part of (its jobs' rids are group_i)
    limits: RequestLimits | None = None

    def publish(self, item: RequestProgress | BaseException) -> None:
        try:
            self.loop.call_soon_threadsafe(self.updates.put_nowait, item)
        except RuntimeError:  # the event loop is gone (shutdown)
            self.cancel.set()


class EngineWorker:
    """Loads the engine, warms it up, then schedules jobs (scheduler.Scheduler) until stopped."""

    def __init__(
        self,
        load_engine: Callable[[], Any],
        *,
        speculative: bool,
        metrics: ServerMetrics,
        max_queued: int | None,
        on_loaded: Callable[[Any], None],
        on_ready: Callable[[], None],
        on_failed: Callable[[BaseException], None],
        step_delay_s: float = 0.0,
        decode_log_interval: int = 40,
    ) -> None:
        self._load_engine = load_engine
        self.speculative = speculative
        self.metrics = metrics
        self.max_queued = max_queued
        self.step_delay_s = step_delay_s
        self.decode_log_interval = decode_log_interval
        self._on_loaded, self._on_ready, self._on_failed = on_loaded, on_ready, on_failed
        self.engine: Any = None
        self.state = "loading"  # loading -> warming -> ready | failed; stopped at shutdown
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self.scheduler: Scheduler | None = None
        self.profile = ProfileControl()  # /start_profile, /stop_profile (sparkit.engines.embedded.profiling)
        self.thread = threading.Thread(target=self._main, name="embedded-engine-worker", daemon=True)

    # event-loop side
    def start(self) -> None:
        self.thread.start()

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def submit(self, job: Job) -> None:
        self.submit_all([job])

    def submit_all(self, jobs: list[Job]) -> None:
        """Queue one request's jobs (a batch, n samples) together, in order: all of them or none.
        Called from the event loop only, so the room checked is the room there is."""
        if self.state != "ready" and not all(job.internal for job in jobs):
            raise ApiError(503, f"the engine is not ready (state: {self.state}); retry when /health answers 200", type="ServiceUnavailableError")
        waiting = self._jobs.qsize() + (len(self.scheduler.waiting) if self.scheduler else 0)
        if self.max_queued is not None and waiting + len(jobs) > self.max_queued:
            what = f"{len(jobs)} more would not fit" if len(jobs) > 1 else "full"
            raise ApiError(503, f"the request queue is {what} ({waiting} queued, at most {self.max_queued}; "
                           "--max-queued-requests)", type="ServiceUnavailableError")
        for job in jobs:
            self._jobs.put(job)
        with self.metrics.lock:
            self.metrics.num_queue_reqs = waiting + len(jobs)

    def wake(self) -> None:
        """Have the worker look at a profile request now, even when it is idle."""
        self._jobs.put(_WAKE)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.state = "stopped"
        scheduler = self.scheduler
        for running in list(scheduler.running) if scheduler else []:
            running.job.cancel.set()
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None and job is not _WAKE:
                job.cancel.set()
                job.publish(ApiError(503, "the server is shutting down", type="ServiceUnavailableError"))
        self._jobs.put(None)

    # worker-thread side
    def _main(self) -> None:
        try:
            self.engine = self._load_engine()
            self._on_loaded(self.engine)
            self.state = "warming"
            self._warm_up()
        except BaseException as exc:  # noqa: BLE001 - reported and turned into exit code 1
            self.state = "failed"
            self._on_failed(exc)
            return
        if self.state == "stopped":
            return
        self.scheduler = Scheduler(self.engine, self.metrics, self.profile, self.speculative,
                                   decode_log_interval=self.decode_log_interval, step_delay_s=self.step_delay_s,
                                   queued=self._jobs.qsize)
        self.state = "ready"
        self._on_ready()
        self._serve(self.scheduler)

    def _serve(self, scheduler: Scheduler) -> None:
        """Take the jobs that arrived (waiting for one when there is nothing to do), then one
        scheduling iteration; until the server stops."""
        while True:
            block = scheduler.idle
            while True:
                try:
                    job = self._jobs.get(block=block)
                except queue.Empty:
                    break
                block = False
                if job is None:
                    scheduler.shut_down()
                    return
                if job is not _WAKE:
                    scheduler.waiting.append(job)
            self.profile.poll()
            scheduler.iterate()
            self.profile.poll()

    def _warm_up(self) -> None:
        tokenizer = self.engine.tokenizer
        ids = tokenizer.encode("The server is warming up.", add_special_tokens=False)
        params = SamplingParams(temperature=0.0, max_new_tokens=8 if self.speculative else 2, ignore_eos=True)
        for step in self.engine.generate(ids, params, lambda: self.state == "stopped"):
            if step.finished:
                break
