"""The embedded engine's scheduler: continuous batching, run by the worker thread.

Each iteration, at a step boundary:
  1. jobs that ended before starting leave the queue (their client left, or their request waited
     past --request-waiting-timeout); running ones whose client left, that an abort or a stop
     string cancelled, or past --request-running-timeout, leave the batch (their KV slot is free);
  2. waiting jobs are admitted in arrival order while a KV slot is free (--max-running-requests);
  3. prefill: at most --chunked-prefill-size prompt tokens, in arrival order, a long prompt one
     chunk per iteration (a sequence's chunks start at multiples of the size, so it is cut the
     same way whatever else runs), a job's first token at the end of its last chunk;
  4. one decode step (a speculative round under NEXTN) of every sequence whose prompt is in,
     computed together (EmbeddedEngine.decode), each sequence getting the bits it gets alone.
A running stream therefore waits at most one prefill chunk between two of its steps, and no job
waits behind one admitted after it. Log lines as SGLang's scheduler writes them: a "Prefill batch."
line per iteration that prefilled, a "Decode batch." line every --decode-log-interval decode steps.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sparkit.engines.embedded.api import StepOutput, TokenLogprobs
from sparkit.engines.embedded.requests import ApiError
from sparkit.engines.embedded.responses import RequestProgress
from sparkit.engines.embedded.server_metrics import DecodeWindow, ServerMetrics
from sparkit.models.profiler_spans import span


def log(line: str) -> None:
    """Startup and scheduler lines go to stdout, flushed (sparkit's log parser reads them live)."""
    print(line, flush=True)


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


@dataclass
class Running:
    """A job admitted into the batch: its sequence (KV slot), what its client has been sent."""

    job: Any  # worker.Job
    seq: Any  # sequence.Sequence
    progress: RequestProgress
    started: float
    last_step_at: float
    longest_stop: int = 0


@dataclass
class Scheduler:
    engine: Any  # EmbeddedEngine
    metrics: ServerMetrics
    profile: Any  # profiling.ProfileControl
    speculative: bool
    decode_log_interval: int = 40
    step_delay_s: float = 0.0
    queued: Any = None  # () -> jobs still in the worker's queue (for #queue-req)
    waiting: deque = field(default_factory=deque)
    running: list[Running] = field(default_factory=list)
    window: DecodeWindow = field(default_factory=DecodeWindow)
    decode_steps: int = 0

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def iterate(self) -> None:
        """One scheduling iteration (see the module docstring)."""
        now = time.perf_counter()
        self._drop_waiting(now)
        self._drop_running(now)
        self._admit()
        worked = self._prefill()
        worked = self._decode() or worked
        if worked and self.step_delay_s and any(not r.job.internal for r in self.running):
            time.sleep(self.step_delay_s)
        self.update_gauges()

    def update_gauges(self) -> None:
        with self.metrics.lock:
            self.metrics.num_running_reqs = len(self.running)
            self.metrics.num_queue_reqs = self.queue_length

    @property
    def queue_length(self) -> int:
        return len(self.waiting) + (self.queued() if self.queued else 0)

    def shut_down(self) -> None:
        """The server stops: running jobs end as aborted, waiting ones get a 503."""
        for job in self.waiting:
            job.cancel.set()
            job.publish(ApiError(503, "the server is shutting down", type="ServiceUnavailableError"))
        self.waiting.clear()
        for running in list(self.running):
            self._finish(running, {"type": "abort", "message": "the server is shutting down"})

    # -- leaving -----------------------------------------------------------------------------------

    def _drop_waiting(self, now: float) -> None:
        kept = deque()
        for job in self.waiting:
            if job.cancel.is_set():  # the client left while queued
                progress = RequestProgress(rid=job.rid, prompt_tokens=len(job.input_ids), speculative=self.speculative)
                progress.finish_reason = {"type": "abort", "message": "client disconnected before the request started"}
                progress.e2e_latency = now - job.arrived
                if not job.internal:  # counted before the client hears of it: /metrics never lags a reply
                    self.metrics.record_request(progress, now - job.arrived, aborted=True, **_labels(job))
                job.publish(progress)
            elif job.limits is not None and (late := job.limits.over(now, job.arrived)) is not None:
                self._time_out(job, late, now)
            else:
                kept.append(job)
        self.waiting = kept

    def _drop_running(self, now: float) -> None:
        for running in list(self.running):
            job = running.job
            if job.cancel.is_set():  # client gone, an abort, a stop string
                self._finish(running, {"type": "abort"})
            elif job.limits is not None and (late := job.limits.over(now, job.arrived)) is not None:
                self._release(running)
                self._time_out(job, late, running.started, running.progress)

    def _time_out(self, job: Any, message: str, started: float, progress: RequestProgress | None = None) -> None:
        """End a job past its request's limit: counted as aborted, and a 503 with SGLang's message
        for its client (the request's other jobs end the same way)."""
        progress = progress or RequestProgress(rid=job.rid, prompt_tokens=len(job.input_ids), speculative=self.speculative)
        progress.finish_reason = {"type": "abort", "message": message, "status_code": 503}
        progress.e2e_latency = time.perf_counter() - job.arrived
        if not job.internal:
            self.metrics.record_request(progress, started - job.arrived, aborted=True, **_labels(job))
        job.publish(ApiError(503, message, type="ServiceUnavailableError"))

    # -- admission and prefill -------------------------------------------------------------------------

    def _admit(self) -> None:
        while self.waiting and self.engine.free_slots > 0:
            job = self.waiting.popleft()
            now = time.perf_counter()
            if job.limits is not None and job.limits.started is None:
                job.limits.started = now  # a request's running time starts with its first job
            try:
                seq = self.engine.open(list(job.input_ids), job.params, job.logprobs)
            except Exception as exc:  # noqa: BLE001 - one bad request must not kill the server
                traceback.print_exc(file=sys.stderr)
                job.publish(ApiError(500, f"the engine failed on this request: {type(exc).__name__}: {exc}", type="InternalServerError"))
                continue
            progress = RequestProgress(rid=job.rid, prompt_tokens=len(job.input_ids), speculative=self.speculative)
            self.running.append(Running(job, seq, progress, now, now, max((len(s) for s in job.stops), default=0)))

    def _prefill(self) -> bool:
        """Prefill chunks, in arrival order, up to the chunk size in prompt tokens (at least one)."""
        size = self.engine.chunk_size()
        budget = size if size > 0 else float("inf")
        spent = sequences = 0
        for running in list(self.running):
            seq = running.seq
            while not seq.finished and seq.generated == 0:
                tokens = seq.next_chunk(size) if not seq.prefill_only or seq.want is not None else 0
                if spent and spent + tokens > budget:
                    self._log_prefill(sequences, spent)
                    return True
                self.profile.poll()
                try:
                    with span("step[EXTEND bs=1]"):  # SGLang's span names (sparkit.bench.trace)
                        out = self.engine.prefill(seq)
                except Exception as exc:  # noqa: BLE001 - one bad request must not kill the server
                    self._fail([running], exc)
                    break
                self.profile.step_done()
                spent += tokens
                if out is not None:
                    sequences += 1
                    self._deliver(running, out, time.perf_counter())
                    break
        if spent or sequences:
            self._log_prefill(sequences, spent)
        return bool(spent or sequences)

    def _log_prefill(self, sequences: int, tokens: int) -> None:
        decoding = sum(1 for r in self.running if r.seq.decoding)
        log(f"Prefill batch. #new-seq: {sequences}, #new-token: {tokens}, #cached-token: 0, "
            f"#running-req: {decoding}, #queue-req: {self.queue_length}")

    # -- decode ------------------------------------------------------------------------------------------

    def _decode(self) -> bool:
        batch = [r for r in self.running if r.seq.decoding]
        if not batch:
            return False
        stage = "VERIFY" if self.speculative else "DECODE"
        self.profile.poll()
        started = time.perf_counter()
        try:
            with span(f"step[{stage} bs={len(batch)}]"):
                outs = self.engine.decode([r.seq for r in batch])
        except Exception as exc:  # noqa: BLE001 - the batch's requests fail, the server goes on
            self._fail(batch, exc)
            return True
        self.profile.step_done()
        now = time.perf_counter()
        self._count_step(batch, outs, now - started)
        for running, out in zip(batch, outs):
            self._deliver(running, out, now)
        return True

    def _count_step(self, batch: list[Running], outs: list[StepOutput], seconds: float) -> None:
        window = self.window
        window.steps += 1
        window.busy_seconds += seconds
        for running, out in zip(batch, outs):
            if running.job.internal:
                continue
            window.tokens += len(out.token_ids)
            if out.verify_step:
                window.verify_steps += 1
                window.accepted += out.num_accepted_drafts
                window.proposed += out.num_proposed_drafts
        self.decode_steps += 1
        if window.steps >= self.decode_log_interval:
            throughput, accept = self.metrics.record_window(window)
            accept_part = ""
            if accept is not None:
                rate = (window.accepted / window.proposed) if window.proposed else 0.0
                accept_part = f"accept len: {accept:.2f}, accept rate: {rate:.2f}, "
            tokens = sum(len(r.seq.seq) for r in self.running)
            log(f"Decode batch. #running-req: {len(batch)}, #token: {tokens}, {accept_part}"
                f"gen throughput (token/s): {throughput:.2f}, #queue-req: {self.queue_length}")
            self.window = DecodeWindow()

    # -- what a step gives a job --------------------------------------------------------------------------

    def _deliver(self, running: Running, step: StepOutput, now: float) -> None:
        """A step's tokens reach the job: stop strings, logprobs, latencies, its stream; the job
        leaves the batch when it finished."""
        job, progress = running.job, running.progress
        new_ids = list(step.token_ids)
        if step.verify_step:
            progress.spec_verify_ct += 1
            progress.spec_num_correct_drafts += step.num_accepted_drafts
            progress.spec_num_proposed_drafts += step.num_proposed_drafts
        stop_hit = self._commit(running, new_ids)
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
            with self.metrics.lock:  # a verify step's tokens share its gap, as bench_serving spreads ITL
                self.metrics.itl.observe((now - running.last_step_at) / len(new_ids), times=len(new_ids))
        running.last_step_at = now
        if stop_hit is not None:
            self._finish(running, stop_hit)
        elif step.finished:
            self._finish(running, step.finish_reason or {"type": "stop", "matched": None})
        elif job.stream:
            job.publish(_snapshot(progress))

    def _commit(self, running: Running, new_ids: list[int]) -> dict | None:
        """Append a step's tokens; match stop strings token by token (a verify step can commit
        several tokens and the stop may end inside the first). Returns the finish reason when a
        stop string matched."""
        job, progress = running.job, running.progress
        if not new_ids:
            return None
        if not job.stops:
            progress.output_ids.extend(new_ids)
            progress.text = stable_text(self._decode_text(progress.output_ids, job.skip_special_tokens), False)
            return None
        for token in new_ids:
            before = len(progress.text)
            progress.output_ids.append(token)
            text = self._decode_text(progress.output_ids, job.skip_special_tokens)
            hit = find_stop(text, job.stops, before - running.longest_stop + 1)
            if hit is not None:
                pos, stop = hit
                progress.text = text[: pos + len(stop)] if job.no_stop_trim else text[:pos]
                return {"type": "stop", "matched": stop}
            progress.text = stable_text(text, False)
        return None

    def _decode_text(self, ids: list[int], skip_special: bool) -> str:
        return self.engine.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def _finish(self, running: Running, reason: dict) -> None:
        """The job is done: its slot freed, its final text, counted, its client told."""
        self._release(running)
        job, progress = running.job, running.progress
        progress.finish_reason = reason
        progress.text = self._final_text(job, progress)
        progress.e2e_latency = time.perf_counter() - job.arrived
        if not job.internal:  # counted before the client hears of it: /metrics never lags a reply
            self.metrics.record_request(progress, running.started - job.arrived, aborted=reason.get("type") == "abort",
                                        **_labels(job))
        job.publish(progress)

    def _fail(self, batch: list[Running], exc: Exception) -> None:
        traceback.print_exception(exc, file=sys.stderr)
        for running in batch:
            self._release(running)
            running.job.publish(ApiError(500, f"the engine failed on this request: {type(exc).__name__}: {exc}",
                                         type="InternalServerError"))

    def _release(self, running: Running) -> None:
        if running in self.running:
            self.running.remove(running)
        self.engine.release(running.seq)

    def _final_text(self, job: Any, progress: RequestProgress) -> str:
        """SGLang's trim_matched_stop: the text ends before a matched stop string or stop token
        (EOS, stop_token_ids, a grammar's end) unless no_stop_trim; output_ids keep the token."""
        finish = progress.finish_reason or {}
        matched = finish.get("matched") if finish.get("type") == "stop" else None
        if isinstance(matched, str):
            return progress.text  # already trimmed at the stop string
        ids = progress.output_ids
        if isinstance(matched, int) and not job.no_stop_trim and ids:
            ids = ids[:-1]
        return self._decode_text(ids, job.skip_special_tokens)


def _labels(job: Any) -> dict[str, bool]:
    """What SGLang's request metrics are split or counted by."""
    return {"streaming": job.stream, "grammar": job.params.grammar is not None}


def _snapshot(progress: RequestProgress) -> RequestProgress:
    """A copy the event loop may read while this thread goes on appending."""
    from dataclasses import replace

    return replace(progress, output_ids=list(progress.output_ids), output_logprobs=_copy(progress.output_logprobs))


def _copy(logprobs: TokenLogprobs | None) -> TokenLogprobs | None:
    if logprobs is None:
        return None
    return TokenLogprobs(list(logprobs.token_ids), list(logprobs.logprobs), None if logprobs.top is None else list(logprobs.top))
