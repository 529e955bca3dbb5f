"""The worker thread: loads the engine, warms it up, then serves jobs one at a time, in arrival
order (batch 1; the engine is called from this one thread only, so it needs no locking), and
writes SGLang's "Decode batch." lines."""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from sparkit.engines.embedded.api import LogprobRequest, SamplingParams, TokenLogprobs
from sparkit.engines.embedded.metrics import DecodeWindow, ServerMetrics
from sparkit.engines.embedded.profiling import ProfileControl, span
from sparkit.engines.embedded.requests import ApiError
from sparkit.engines.embedded.responses import RequestProgress

_WAKE = object()  # put on the job queue so that an idle worker acts on a profile request

DECODE_LOG_INTERVAL = 40  # decode steps between "Decode batch." lines and gauge updates (as SGLang)


def log(line: str) -> None:
    """Startup and decode lines go to stdout, flushed (sparkit's log parser reads them live)."""
    print(line, flush=True)


# -- the text a request streams ----------------------------------------------------------------


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


# -- the worker -----------------------------------------------------------------------------------


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

    def publish(self, item: RequestProgress | BaseException) -> None:
        try:
            self.loop.call_soon_threadsafe(self.updates.put_nowait, item)
        except RuntimeError:  # the event loop is gone (shutdown)
            self.cancel.set()


class EngineWorker:
    """Loads the engine, warms it up, then serves jobs one at a time, in arrival order."""

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
    ) -> None:
        self._load_engine = load_engine
        self.speculative = speculative
        self.metrics = metrics
        self.max_queued = max_queued
        self.step_delay_s = step_delay_s
        self._on_loaded, self._on_ready, self._on_failed = on_loaded, on_ready, on_failed
        self.engine: Any = None
        self.state = "loading"  # loading -> warming -> ready | failed; stopped at shutdown
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._current: Job | None = None
        self._window = DecodeWindow()
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
        if self.max_queued is not None and self._jobs.qsize() + len(jobs) > self.max_queued:
            what = f"{len(jobs)} more would not fit" if len(jobs) > 1 else "full"
            raise ApiError(503, f"the request queue is {what} ({self._jobs.qsize()} queued, at most {self.max_queued}; "
                           "--max-queued-requests)", type="ServiceUnavailableError")
        for job in jobs:
            self._jobs.put(job)
        with self.metrics.lock:
            self.metrics.num_queue_reqs = self._jobs.qsize()

    def wake(self) -> None:
        """Have the worker look at a profile request now, even when it is idle."""
        self._jobs.put(_WAKE)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.state = "stopped"
        current = self._current
        if current is not None:
            current.cancel.set()
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
        self.state = "ready"
        self._on_ready()
        while True:
            job = self._jobs.get()
            self.profile.poll()
            if job is _WAKE:
                continue
            with self.metrics.lock:
                self.metrics.num_queue_reqs = self._jobs.qsize()
            if job is None:
                return
            self._current = job
            try:
                self._serve(job)
            finally:
                self._current = None

    def _warm_up(self) -> None:
        tokenizer = self.engine.tokenizer
        ids = tokenizer.encode("The server is warming up.", add_special_tokens=False)
        params = SamplingParams(temperature=0.0, max_new_tokens=8 if self.speculative else 2, ignore_eos=True)
        for step in self.engine.generate(ids, params, lambda: self.state == "stopped"):
            if step.finished:
                break

    def _decode(self, ids: list[int], skip_special: bool) -> str:
        return self.engine.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def _serve(self, job: Job) -> None:
        started = time.perf_counter()
        progress = RequestProgress(rid=job.rid, prompt_tokens=len(job.input_ids), speculative=self.speculative)
        if job.cancel.is_set():  # the client left while queued
            progress.finish_reason = {"type": "abort", "message": "client disconnected before the request started"}
            progress.e2e_latency = started - job.arrived
            if not job.internal:  # counted before the client hears of it: /metrics never lags a reply
                self.metrics.record_request(progress, started - job.arrived, aborted=True, **_labels(job))
            job.publish(progress)
            return
        with self.metrics.lock:
            self.metrics.num_running_reqs = 1
        longest_stop = max((len(s) for s in job.stops), default=0)
        last_step_at = started
        try:
            extra = {"logprobs": job.logprobs} if job.logprobs is not None else {}
            steps = self.engine.generate(list(job.input_ids), job.params, job.cancel.is_set, **extra)
            stage = "EXTEND"  # the first step is the prefill; then a decode (or verify) step each
            while True:
                self.profile.poll()
                with span(f"step[{stage} bs=1]"):  # SGLang's span names (sparkit.bench.trace)
                    try:
                        step = next(steps)
                    except StopIteration:
                        break
                self.profile.step_done()
                stage = "VERIFY" if self.speculative else "DECODE"
                if self.step_delay_s and not job.internal:
                    time.sleep(self.step_delay_s)
                now = time.perf_counter()
                new_ids = list(step.token_ids)
                if step.verify_step:
                    progress.spec_verify_ct += 1
                    progress.spec_num_correct_drafts += step.num_accepted_drafts
                    progress.spec_num_proposed_drafts += step.num_proposed_drafts
                stop_hit = self._commit(job, progress, new_ids, longest_stop)
                if step.input_logprobs is not None:
                    progress.input_logprobs = step.input_logprobs
                if step.logprobs is not None:
                    if progress.output_logprobs is None:
                        progress.output_logprobs = TokenLogprobs(top=[] if step.logprobs.top is not None else None)
                    progress.output_logprobs.extend(step.logprobs)
                    progress.output_logprobs.truncate(len(progress.output_ids))  # a stop string may end the step early
                if new_ids and progress.first_token_latency is None:
                    progress.first_token_latency = now - job.arrived
                elif new_ids and not job.internal:
                    self._track_decode_step(progress, step, len(new_ids), now - last_step_at)
                last_step_at = now
                if stop_hit is not None:
                    progress.finish_reason = stop_hit
                    job.cancel.set()  # the engine aborts on its next check and frees the KV cache
                    for _ in steps:
                        pass
                    break
                if step.finished:
                    progress.finish_reason = step.finish_reason or {"type": "stop", "matched": None}
                    break
                if job.stream:
                    job.publish(_snapshot(progress))
            if progress.finish_reason is None:  # the engine ended without a finishing step
                progress.finish_reason = {"type": "abort", "message": "the engine stopped without a finish reason"}
        except Exception as exc:  # noqa: BLE001 - one bad request must not kill the server
            traceback.print_exc(file=sys.stderr)
            job.publish(ApiError(500, f"the engine failed on this request: {type(exc).__name__}: {exc}", type="InternalServerError"))
            return
        finally:
            with self.metrics.lock:
                self.metrics.num_running_reqs = 0
            self.profile.poll()
        progress.text = self._final_text(job, progress)
        progress.e2e_latency = time.perf_counter() - job.arrived
        if not job.internal:  # counted before the client hears of it: /metrics never lags a reply
            aborted = progress.finish_reason.get("type") == "abort"
            self.metrics.record_request(progress, started - job.arrived, aborted=aborted, **_labels(job))
        job.publish(progress)

    def _commit(self, job: Job, progress: RequestProgress, new_ids: list[int], longest_stop: int) -> dict | None:
        """Append a step's tokens; match stop strings token by token (a verify step can
        commit several tokens and the stop may end inside the first). Returns the
        finish reason when a stop string matched."""
        if not new_ids:
            return None
        if not job.stops:
            progress.output_ids.extend(new_ids)
            progress.text = stable_text(self._decode(progress.output_ids, job.skip_special_tokens), False)
            return None
        for token in new_ids:
            before = len(progress.text)
            progress.output_ids.append(token)
            text = self._decode(progress.output_ids, job.skip_special_tokens)
            hit = find_stop(text, job.stops, before - longest_stop + 1)
            if hit is not None:
                pos, stop = hit
                progress.text = text[: pos + len(stop)] if job.no_stop_trim else text[:pos]
                return {"type": "stop", "matched": stop}
            progress.text = stable_text(text, False)
        return None

    def _final_text(self, job: Job, progress: RequestProgress) -> str:
        """SGLang's trim_matched_stop: the text ends before a matched stop string or stop token
        (EOS, stop_token_ids, a grammar's end) unless no_stop_trim; output_ids keep the token."""
        finish = progress.finish_reason or {}
        matched = finish.get("matched") if finish.get("type") == "stop" else None
        if isinstance(matched, str):
            return progress.text  # already trimmed at the stop string
        ids = progress.output_ids
        if isinstance(matched, int) and not job.no_stop_trim and ids:
            ids = ids[:-1]
        return self._decode(ids, job.skip_special_tokens)

    def _track_decode_step(self, progress: RequestProgress, step: Any, n_tokens: int, gap: float) -> None:
        with self.metrics.lock:  # a verify step's tokens share its gap, as bench_serving spreads ITL
            self.metrics.itl.observe(gap / n_tokens, times=n_tokens)
        window = self._window
        window.steps += 1
        window.tokens += n_tokens
        window.busy_seconds += gap
        if step.verify_step:
            window.verify_steps += 1
            window.accepted += step.num_accepted_drafts
            window.proposed += step.num_proposed_drafts
        if window.steps >= DECODE_LOG_INTERVAL:
            throughput, accept = self.metrics.record_window(window)
            accept_part = ""
            if accept is not None:
                rate = (window.accepted / window.proposed) if window.proposed else 0.0
                accept_part = f"accept len: {accept:.2f}, accept rate: {rate:.2f}, "
            log(
                f"Decode batch. #running-req: 1, #token: {progress.prompt_tokens + progress.completion_tokens}, "
                f"{accept_part}gen throughput (token/s): {throughput:.2f}, #queue-req: {self._jobs.qsize()}"
            )
            self._window = DecodeWindow()


def _labels(job: Job) -> dict[str, bool]:
    """What SGLang's request metrics are split or counted by."""
    return {"streaming": job.stream, "grammar": job.params.grammar is not None}


def _snapshot(progress: RequestProgress) -> RequestProgress:
    """A copy the event loop may read while this thread goes on appending."""
    return replace(progress, output_ids=list(progress.output_ids), output_logprobs=_copy(progress.output_logprobs))


def _copy(logprobs: TokenLogprobs | None) -> TokenLogprobs | None:
    if logprobs is None:
        return None
    return TokenLogprobs(list(logprobs.token_ids), list(logprobs.logprobs), None if logprobs.top is None else list(logprobs.top))
