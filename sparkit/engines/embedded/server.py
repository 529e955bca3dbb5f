"""The embedded engine's HTTP server: SGLang's HTTP surface over one EmbeddedEngine.

    python -m sparkit.engines.embedded --model-path DIR [--speculative-algorithm NEXTN ...]

Structure (one process):

    uvicorn event loop  ── Job (input ids, SamplingParams, cancel flag) ──>  FIFO queue
         ^                                                                      │
         └── RequestProgress snapshots (call_soon_threadsafe) ──  EngineWorker thread
                                                                  (loads the engine, warms up,
                                                                   then runs jobs one at a time)

The engine is called from that ONE worker thread only (batch 1, see api.py), so
concurrent clients queue and never share state. A client that goes away sets its
job's cancel flag; the engine checks it every step and frees the slot.

The HTTP port is bound before the model loads so that /health can answer 503
while starting, as SGLang does; a load failure stops the server with exit code 1
and a message naming the file.

`build_arg_parser()` must stay importable without torch, starlette or uvicorn: the
recipe compiler validates pass-through flags with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import queue
import shlex
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Callable

from sparkit.engines.embedded import protocol as proto
from sparkit.engines.embedded.api import SamplingParams
from sparkit.kernels.rescoring import DEFAULT_EXACT_TOP_K

API_KEY_ENV = "SPARKIT_API_KEY"
READY_LINE = "The server is fired up and ready to roll!"
DECODE_LOG_INTERVAL = 40  # decode steps between "Decode batch." lines and gauge updates (as SGLang)


# -- launch flags ---------------------------------------------------------------------------


def build_arg_parser() -> argparse.ArgumentParser:
    """The embedded engine's launch flags (SGLang's names where one exists; see api.py)."""
    p = argparse.ArgumentParser(
        prog="python -m sparkit.engines.embedded",
        description="sparkit's embedded engine: tiny-ling behind SGLang's HTTP API.",
    )
    p.add_argument("--model-path", required=True, help="a tiny-ling checkpoint directory (config.json, model.safetensors, tokenizer)")
    p.add_argument("--served-model-name", default=None, help="model name in the API (default: the directory name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto = cuda when available")
    p.add_argument("--expert-weights", choices=["bf16", "fp8", "mxfp4"], default="bf16", help="routed/shared expert weight format (quantised at load)")
    p.add_argument("--lm-head-dtype", choices=["bf16", "fp32", "fp8"], default="bf16", help="fp8 = online per-row e4m3 quantisation at load")
    p.add_argument("--lm-head-exact-top-k", type=int, default=DEFAULT_EXACT_TOP_K, metavar="K",
                   help="fp8 head: re-score the K best candidates per row exactly from a kept bf16 copy (0 = off)")
    p.add_argument("--dtype", choices=["bfloat16", "float32", "auto"], default="auto", help="activation dtype (auto: float32 on cpu, bfloat16 on cuda)")
    p.add_argument("--speculative-algorithm", type=str.upper, choices=["NEXTN", "EAGLE"], default=None, help="EAGLE is an alias of NEXTN; omitted = no speculation")
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--speculative-draft-model-path", default=None, help="take the NextN layer from another checkpoint")
    p.add_argument(
        "--draft-lm-head-sharing", choices=["module", "tensor"], default=None,
        help="how the NextN draft uses the target's lm_head: the same module (default) or a copy of its tensor",
    )
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--api-key", default=None, help=f"require 'Authorization: Bearer KEY' (everything but /health); env {API_KEY_ENV} also works")
    p.add_argument("--enable-metrics", action="store_true", help="accepted for SGLang parity; /metrics is always on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-queued-requests", type=int, default=None, help="queued requests beyond this get HTTP 503")
    p.add_argument("--debug-step-delay-ms", type=float, default=0.0, metavar="MS",
                   help="sleep this long after every decode step (tests of streaming and aborts: an upper bound "
                        "on the engine's speed that no machine load can lift)")
    p.add_argument("--torch-threads", type=int, default=0, metavar="N",
                   help="intra-op threads for the engine (0 = auto: one per 20M parameters, at most the CPU count)")
    return p


def validate_args(args: argparse.Namespace) -> list[str]:
    """Cross-flag problems argparse cannot express (empty = fine)."""
    problems = []
    spec = [args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens]
    if args.speculative_algorithm is None and (any(v is not None for v in spec) or args.speculative_draft_model_path):
        problems.append("--speculative-* numbers or --speculative-draft-model-path given without --speculative-algorithm")
    if args.speculative_algorithm is not None:
        if args.speculative_num_steps is not None and args.speculative_num_steps < 1:
            problems.append("--speculative-num-steps must be >= 1")
        if args.speculative_eagle_topk not in (None, 1):
            problems.append("--speculative-eagle-topk: the embedded engine supports only 1")
        if (
            args.speculative_num_steps is not None
            and args.speculative_num_draft_tokens is not None
            and args.speculative_num_draft_tokens != args.speculative_num_steps + 1
        ):
            problems.append("--speculative-num-draft-tokens must be --speculative-num-steps + 1 with topk 1")
    if args.lm_head_exact_top_k < 0:
        problems.append("--lm-head-exact-top-k must be >= 0")
    if args.context_length is not None and args.context_length < 2:
        problems.append("--context-length must be >= 2")
    if args.max_queued_requests is not None and args.max_queued_requests < 1:
        problems.append("--max-queued-requests must be >= 1")
    if args.debug_step_delay_ms < 0:
        problems.append("--debug-step-delay-ms must be >= 0")
    if args.torch_threads < 0:
        problems.append("--torch-threads must be >= 0 (0 = auto)")
    return problems


def _redacted_argv(argv: list[str]) -> list[str]:
    out, hide_next = [], False
    for arg in argv:
        if hide_next:
            out.append("<redacted>")
            hide_next = False
        elif arg == "--api-key":
            out.append(arg)
            hide_next = True
        elif arg.startswith("--api-key="):
            out.append("--api-key=<redacted>")
        else:
            out.append(arg)
    return out


def log(line: str) -> None:
    """Startup and decode lines go to stdout, flushed (sparkit's log parser reads them live)."""
    print(line, flush=True)


# -- metrics ------------------------------------------------------------------------------------

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_ITL_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += times
        self.total += times
        self.sum += value * times


@dataclass
class DecodeWindow:
    """Tokens and verify steps since the last 'Decode batch.' line."""

    steps: int = 0
    tokens: int = 0
    verify_steps: int = 0
    accepted: int = 0
    proposed: int = 0
    busy_seconds: float = 0.0  # decode time only: idle gaps between requests would understate tok/s


class ServerMetrics:
    """Counters behind /metrics and /server_info. Written by the worker, read by the event loop.

    Counters are exact and count user requests only (warm-up and /health_generate
    are excluded), at the moment a request finishes, with the completion tokens the
    client was sent, so a benchmark can reconcile its own counts with them.
    """

    def __init__(self, speculative: bool, context_length: int | None, spec_steps: int | None, spec_draft_tokens: int | None) -> None:
        self.lock = threading.Lock()
        self.speculative = speculative
        self.context_length = context_length or 0
        self.spec_steps = spec_steps or 0
        self.spec_draft_tokens = spec_draft_tokens or 0
        self.num_requests_total = 0
        self.num_aborted_requests_total = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.spec_verify_calls_total = 0
        self.spec_tokens_in_verified_requests = 0  # completion tokens of requests that speculated
        self.spec_accepted_drafts_total = 0
        self.spec_proposed_drafts_total = 0
        self.num_running_reqs = 0
        self.num_queue_reqs = 0
        self.gen_throughput = 0.0
        self.spec_accept_length = 0.0
        self.spec_accept_rate = 0.0
        self.ttft = Histogram(_LATENCY_BUCKETS)
        self.e2e = Histogram(_LATENCY_BUCKETS)
        self.queue_time = Histogram(_LATENCY_BUCKETS)
        self.itl = Histogram(_ITL_BUCKETS)

    def record_request(self, progress: proto.RequestProgress, queue_seconds: float, aborted: bool) -> None:
        with self.lock:
            self.num_requests_total += 1
            if aborted:
                self.num_aborted_requests_total += 1
            self.prompt_tokens_total += progress.prompt_tokens
            self.generation_tokens_total += progress.completion_tokens
            self.spec_verify_calls_total += progress.spec_verify_ct
            if progress.spec_verify_ct:
                self.spec_tokens_in_verified_requests += progress.completion_tokens
            self.spec_accepted_drafts_total += progress.spec_num_correct_drafts
            self.spec_proposed_drafts_total += progress.spec_num_proposed_drafts
            if progress.first_token_latency is not None:
                self.ttft.observe(progress.first_token_latency)
            if progress.e2e_latency is not None:
                self.e2e.observe(progress.e2e_latency)
            self.queue_time.observe(queue_seconds)

    def record_window(self, window: DecodeWindow) -> tuple[float, float | None]:
        """Update the gauges from a decode window; returns (tok/s, accept length or None)."""
        throughput = window.tokens / max(window.busy_seconds, 1e-9)
        accept = (window.tokens / window.verify_steps) if window.verify_steps else None
        with self.lock:
            self.gen_throughput = throughput
            if accept is not None:
                self.spec_accept_length = accept
                self.spec_accept_rate = (window.accepted / window.proposed) if window.proposed else 0.0
        return throughput, accept

    @property
    def avg_spec_accept_length(self) -> float:
        """Completion tokens per verify step over all speculative requests served."""
        with self.lock:
            if not self.spec_verify_calls_total:
                return 0.0
            return self.spec_tokens_in_verified_requests / self.spec_verify_calls_total

    def render(self, model_name: str) -> str:
        """Prometheus text exposition, with sglang's metric names."""
        label = f'model_name="{_escape_label(model_name)}"'
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, value: float) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            out.append(f"{name}{{{label}}} {_num(value)}")

        def histogram(name: str, help_: str, hist: Histogram) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} histogram")
            for bound, count in zip(hist.buckets, hist.counts):
                out.append(f'{name}_bucket{{{label},le="{_num(bound)}"}} {count}')
            out.append(f'{name}_bucket{{{label},le="+Inf"}} {hist.total}')
            out.append(f"{name}_sum{{{label}}} {_num(hist.sum)}")
            out.append(f"{name}_count{{{label}}} {hist.total}")

        with self.lock:
            metric("sglang:num_running_reqs", "gauge", "The number of running requests.", self.num_running_reqs)
            metric("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", self.num_queue_reqs)
            metric("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", self.gen_throughput)
            metric("sglang:context_len", "gauge", "The context length.", self.context_length)
            metric("sglang:spec_accept_length", "gauge", "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).", self.spec_accept_length)
            metric("sglang:spec_accept_rate", "gauge", "Speculative acceptance rate (accepted drafts / proposed drafts).", self.spec_accept_rate)
            metric("sglang:spec_num_steps", "gauge", "Speculative decoding num steps.", self.spec_steps)
            metric("sglang:spec_num_draft_tokens", "gauge", "Speculative decoding num draft tokens.", self.spec_draft_tokens)
            metric("sglang:num_requests_total", "counter", "Number of requests processed.", self.num_requests_total)
            metric("sglang:num_aborted_requests_total", "counter", "Number of requests aborted.", self.num_aborted_requests_total)
            metric("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", self.prompt_tokens_total)
            metric("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", self.generation_tokens_total)
            metric("sglang:cached_tokens_total", "counter", "Number of cached prompt tokens.", 0)
            metric("sglang:spec_verify_calls_total", "counter", "Number of speculative verify forward passes.", self.spec_verify_calls_total)
            histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft)
            histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", self.e2e)
            histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.itl)
            histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", self.queue_time)
        return "\n".join(out) + "\n"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e15):
        return str(int(value)) + ".0" if isinstance(value, float) else str(value)
    return repr(float(value))


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
    arrived: float = field(default_factory=time.perf_counter)

    def publish(self, item: proto.RequestProgress | BaseException) -> None:
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
        self.thread = threading.Thread(target=self._main, name="embedded-engine-worker", daemon=True)

    # event-loop side
    def start(self) -> None:
        self.thread.start()

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def submit(self, job: Job) -> None:
        if self.state != "ready" and not job.internal:
            raise proto.ApiError(503, f"the engine is not ready (state: {self.state}); retry when /health answers 200", type="ServiceUnavailableError")
        if self.max_queued is not None and self._jobs.qsize() >= self.max_queued:
            raise proto.ApiError(503, f"the request queue is full ({self.max_queued} queued; --max-queued-requests)", type="ServiceUnavailableError")
        self._jobs.put(job)
        with self.metrics.lock:
            self.metrics.num_queue_reqs = self._jobs.qsize()

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
            if job is not None:
                job.cancel.set()
                job.publish(proto.ApiError(503, "the server is shutting down", type="ServiceUnavailableError"))
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
        progress = proto.RequestProgress(rid=job.rid, prompt_tokens=len(job.input_ids), speculative=self.speculative)
        if job.cancel.is_set():  # the client left while queued
            progress.finish_reason = {"type": "abort", "message": "client disconnected before the request started"}
            progress.e2e_latency = started - job.arrived
            job.publish(progress)
            if not job.internal:
                self.metrics.record_request(progress, started - job.arrived, aborted=True)
            return
        with self.metrics.lock:
            self.metrics.num_running_reqs = 1
        longest_stop = max((len(s) for s in job.stops), default=0)
        last_step_at = started
        try:
            steps = self.engine.generate(list(job.input_ids), job.params, job.cancel.is_set)
            for step in steps:
                if self.step_delay_s and not job.internal:
                    time.sleep(self.step_delay_s)
                now = time.perf_counter()
                new_ids = list(step.token_ids)
                if step.verify_step:
                    progress.spec_verify_ct += 1
                    progress.spec_num_correct_drafts += step.num_accepted_drafts
                    progress.spec_num_proposed_drafts += step.num_proposed_drafts
                stop_hit = self._commit(job, progress, new_ids, longest_stop)
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
            job.publish(proto.ApiError(500, f"the engine failed on this request: {type(exc).__name__}: {exc}", type="InternalServerError"))
            return
        finally:
            with self.metrics.lock:
                self.metrics.num_running_reqs = 0
        progress.text = self._final_text(job, progress)
        progress.e2e_latency = time.perf_counter() - job.arrived
        job.publish(progress)
        if not job.internal:
            aborted = progress.finish_reason.get("type") == "abort"
            self.metrics.record_request(progress, started - job.arrived, aborted=aborted)

    def _commit(self, job: Job, progress: proto.RequestProgress, new_ids: list[int], longest_stop: int) -> dict | None:
        """Append a step's tokens; match stop strings token by token (a verify step can
        commit several tokens and the stop may end inside the first). Returns the
        finish reason when a stop string matched."""
        if not new_ids:
            return None
        if not job.stops:
            progress.output_ids.extend(new_ids)
            progress.text = proto.stable_text(self._decode(progress.output_ids, job.skip_special_tokens), False)
            return None
        for token in new_ids:
            before = len(progress.text)
            progress.output_ids.append(token)
            text = self._decode(progress.output_ids, job.skip_special_tokens)
            hit = proto.find_stop(text, job.stops, before - longest_stop + 1)
            if hit is not None:
                pos, stop = hit
                progress.text = text[: pos + len(stop)] if job.no_stop_trim else text[:pos]
                return {"type": "stop", "matched": stop}
            progress.text = proto.stable_text(text, False)
        return None

    def _final_text(self, job: Job, progress: proto.RequestProgress) -> str:
        if progress.finish_reason and progress.finish_reason.get("type") == "stop" and isinstance(progress.finish_reason.get("matched"), str):
            return progress.text  # already trimmed at the stop string
        return self._decode(progress.output_ids, job.skip_special_tokens)

    def _track_decode_step(self, progress: proto.RequestProgress, step: Any, n_tokens: int, gap: float) -> None:
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


def _snapshot(progress: proto.RequestProgress) -> proto.RequestProgress:
    return replace(progress, output_ids=list(progress.output_ids))


# -- engine loading ------------------------------------------------------------------------------------


class CheckpointError(Exception):
    """The checkpoint cannot be used; str() names the file."""


def check_checkpoint(model_path: Path) -> dict:
    """Fail fast, naming the file, before torch is even imported."""
    if not model_path.is_dir():
        raise CheckpointError(f"--model-path {model_path}: not a directory (build one with `sparkit model make-tiny {model_path}`)")
    config_path = model_path / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{config_path}: missing (is {model_path} a tiny-ling checkpoint?)") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{config_path}: unreadable or corrupt: {exc}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path}: corrupt: expected a JSON object")
    weights = model_path / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing")
    try:
        size = weights.stat().st_size
        with weights.open("rb") as fh:
            header_len = int.from_bytes(fh.read(8), "little")
            if header_len <= 0 or header_len > size - 8:
                raise ValueError("bad header length (truncated or not a safetensors file)")
            header = json.loads(fh.read(header_len))
        data_end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        if 8 + header_len + data_end > size:
            raise ValueError(f"truncated: tensors need {8 + header_len + data_end} bytes, the file has {size}")
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise CheckpointError(f"{weights}: unreadable or corrupt safetensors file: {exc}") from None
    return config


def checkpoint_parameters(model_path: Path) -> int:
    """Parameter count from the safetensors header (0 when unreadable: check_checkpoint names why)."""
    try:
        with (Path(model_path) / "model.safetensors").open("rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        return sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def engine_config_values(args: argparse.Namespace, served_name: str) -> dict[str, Any]:
    """Launch flags in the engine's field names (api.py's flag names, snake_case)."""
    return {
        "model_path": args.model_path,
        "served_model_name": served_name,
        "device": args.device,
        "expert_weights": args.expert_weights,
        "lm_head_dtype": args.lm_head_dtype,
        "lm_head_exact_top_k": args.lm_head_exact_top_k,
        "dtype": None if args.dtype == "auto" else args.dtype,
        "speculative_algorithm": args.speculative_algorithm,
        "speculative_num_steps": args.speculative_num_steps,
        "speculative_eagle_topk": args.speculative_eagle_topk,
        "speculative_num_draft_tokens": args.speculative_num_draft_tokens,
        "speculative_draft_model_path": args.speculative_draft_model_path,
        "draft_lm_head_sharing": args.draft_lm_head_sharing,
        "context_length": args.context_length,
        "seed": args.seed,
    }


# Parameters per intra-op thread under --torch-threads auto. A small model's decode step is
# bound by the number of ops, not by arithmetic: extra threads add synchronisation, and when
# another process holds a core they spin against it (measured on tiny-ling, 2 cores, one busy
# process beside the server: 2 threads decode ~4x slower than 1; benchmarks/embedded_contention.py).
PARAMETERS_PER_THREAD = 20_000_000


def auto_torch_threads(parameters: int, cpus: int | None = None) -> int:
    cpus = cpus or os.cpu_count() or 1
    return max(1, min(cpus, -(-int(parameters) // PARAMETERS_PER_THREAD)))


def load_engine(args: argparse.Namespace, served_name: str, parameters: int = 0) -> Any:
    import torch

    from sparkit.engines.embedded.engine import EmbeddedEngine, EngineConfig

    values = engine_config_values(args, served_name)
    if is_dataclass(EngineConfig):
        names = {f.name for f in fields(EngineConfig)}
        values = {k: v for k, v in values.items() if k in names and v is not None}
    log(f"Load weight begin. model_path={args.model_path}, device={args.device}, expert_weights={args.expert_weights}, lm_head_dtype={args.lm_head_dtype}")
    engine = EmbeddedEngine(EngineConfig(**values))
    threads = args.torch_threads or auto_torch_threads(parameters)
    torch.set_num_threads(threads)  # in the worker thread, which runs every forward
    log(f"torch intra-op threads: {threads} ({'--torch-threads' if args.torch_threads else 'auto'}, "
        f"{parameters / 1e6:.1f}M parameters, {os.cpu_count()} CPUs)")
    for line in load_weight_end_lines(engine):
        log(line)
    for note in engine.activation_report().notes:  # e.g. "Online FP8 quantization enabled for lm_head."
        log(note)
    return engine


def load_weight_end_lines(engine: Any) -> list[str]:
    """SGLang's 'Load weight end.' line, one per model (target, then the NextN draft)."""
    report = engine.activation_report()
    seconds = getattr(engine, "load_seconds", {}) or {}
    lines = []
    for role in ("target", "draft"):
        model = report.models.get(role)
        if model is None:
            continue
        moe = model.moe
        quant = moe.expert_weight_format if moe else "none"
        parts = [
            f"elapsed={seconds.get(role, 0.0):.2f} s",
            f"type={model.model_class}",
            f"quant={quant}",
            f"lm_head={model.lm_head.weight_dtype}/{model.lm_head.quant_method}",
        ]
        if moe:
            parts.append(f"moe_runner={moe.runner}/{moe.quant_method}")
        if role == "draft":
            parts.append(f"lm_head_shared_with_target={model.lm_head.shared_with_target}")
        lines.append("Load weight end. " + ", ".join(parts))
    return lines


# -- HTTP -----------------------------------------------------------------------------------------------


class ServerState:
    """Everything the routes need; built once in main()."""

    def __init__(self, args: argparse.Namespace, argv: list[str], model_config: dict) -> None:
        self.args = args
        self.argv = argv
        self.model_config = model_config
        self.model_path = Path(args.model_path)
        self.served_name = args.served_model_name or self.model_path.name
        self.api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
        self.speculative = args.speculative_algorithm is not None
        self.started_at = time.time()
        self.metrics = ServerMetrics(
            self.speculative,
            args.context_length or model_config.get("max_position_embeddings"),
            args.speculative_num_steps,
            args.speculative_num_draft_tokens,
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
        a = self.args
        resolved: dict[str, Any] = {
            "model_path": str(a.model_path),
            "tokenizer_path": str(a.model_path),
            "served_model_name": self.served_name,
            "host": a.host,
            "port": a.port,
            "device": a.device,
            "dtype": a.dtype,
            "context_length": a.context_length,
            "speculative_algorithm": a.speculative_algorithm,
            "speculative_num_steps": a.speculative_num_steps,
            "speculative_eagle_topk": a.speculative_eagle_topk,
            "speculative_num_draft_tokens": a.speculative_num_draft_tokens,
            "speculative_draft_model_path": a.speculative_draft_model_path,
            "expert_weights": a.expert_weights,
            "lm_head_dtype": a.lm_head_dtype,
            "lm_head_exact_top_k": a.lm_head_exact_top_k if a.lm_head_dtype == "fp8" else None,
            "random_seed": a.seed,
            "enable_metrics": True,
            "max_queued_requests": a.max_queued_requests,
            "api_key": "<redacted>" if self.api_key else None,
            "tp_size": 1,
            "dp_size": 1,
            "ep_size": 1,
            "max_running_requests": 1,
        }
        if self.engine is not None:
            resolved.update(self.engine.server_args())
        return resolved

    def launch_command(self) -> str:
        return shlex.join([sys.executable, "-m", "sparkit.engines.embedded", *_redacted_argv(self.argv)])

    def accepts_model(self, name: str | None) -> bool:
        return name in (None, "", "default", self.served_name, str(self.args.model_path), self.model_path.name)


def create_app(state: ServerState):
    """The Starlette app. Imports starlette lazily (see the module docstring)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.routing import Route

    def error(exc: proto.ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    def require_ready() -> EngineWorker:
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

    async def run_to_end(job: Job, request: Request) -> proto.RequestProgress:
        """Non-streamed: wait for the end, watching for the client leaving meanwhile."""
        require_ready().submit(job)
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

    def check_prompt(ids: list[int], requested_max: int | None, default_max: int | None) -> int:
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

    # -- routes
    async def health(request: Request) -> Response:
        worker = state.worker
        if worker is not None and worker.ready:
            return Response(status_code=200)
        return Response(status_code=503)

    async def health_generate(request: Request) -> Response:
        worker = state.worker
        if worker is None or not worker.ready:
            return Response(status_code=503)
        ids = worker.engine.tokenizer.encode("ping", add_special_tokens=False)
        job = new_job(ids, SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True), [], no_stop_trim=False, skip_special=True, stream=False, rid=None, internal=True)
        try:
            await run_to_end(job, request)
        except proto.ApiError:
            return Response(status_code=503)
        return Response(status_code=200)

    async def generate(request: Request) -> Response:
        req: proto.GenerateRequest = proto.parse_body(await request.body(), proto.GenerateRequest, "/generate")
        worker = require_ready()
        sp = req.sampling_params
        if req.input_ids is not None:
            ids = list(req.input_ids)
        else:
            ids = worker.engine.tokenizer.encode(req.text, add_special_tokens=False)
        max_new = check_prompt(ids, sp.max_new_tokens, proto.DEFAULT_GENERATE_MAX_NEW_TOKENS)
        job = new_job(ids, sampling(sp, max_new, sp.sampling_seed), sp.stop_list(), no_stop_trim=sp.no_stop_trim, skip_special=sp.skip_special_tokens, stream=req.stream, rid=req.rid)
        if not req.stream:
            return JSONResponse(proto.generate_response(await run_to_end(job, request)))
        worker.submit(job)

        async def body():
            try:
                async for progress in updates(job):
                    yield proto.sse(proto.generate_response(progress, streaming=True))
            except proto.ApiError as exc:
                yield proto.sse(exc.body())
            yield proto.SSE_DONE

        return JobStream(body(), job)

    def check_model(name: str | None) -> None:
        if not state.accepts_model(name):
            raise proto.ApiError(404, f"The model `{name}` does not exist; this server serves `{state.served_name}`.", type="NotFoundError", param="model")

    async def chat_completions(request: Request) -> Response:
        req: proto.ChatCompletionRequest = proto.parse_body(await request.body(), proto.ChatCompletionRequest, "/v1/chat/completions")
        check_model(req.model)
        worker = require_ready()
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in req.messages]
        try:
            prompt = worker.engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **(req.chat_template_kwargs or {}))
        except Exception as exc:  # noqa: BLE001 - a template error is the request's fault
            raise proto.ApiError(400, f"messages: the chat template failed: {exc}") from None
        ids = worker.engine.tokenizer.encode(prompt, add_special_tokens=False)
        max_new = check_prompt(ids, req.requested_max_tokens(), None)
        return await openai_response("chat", req, ids, max_new, request)

    async def completions(request: Request) -> Response:
        req: proto.CompletionRequest = proto.parse_body(await request.body(), proto.CompletionRequest, "/v1/completions")
        check_model(req.model)
        worker = require_ready()
        prompt = req.prompt_text_or_ids()
        ids = list(prompt) if isinstance(prompt, list) else worker.engine.tokenizer.encode(prompt, add_special_tokens=False)
        max_new = check_prompt(ids, req.max_tokens, proto.DEFAULT_COMPLETION_MAX_TOKENS)
        return await openai_response("completion", req, ids, max_new, request)

    async def openai_response(kind: str, req: Any, ids: list[int], max_new: int, request: Request) -> Response:
        model = state.served_name
        created = proto.now_created()
        job = new_job(ids, sampling(req, max_new, req.seed), req.stop_list(), no_stop_trim=req.no_stop_trim, skip_special=req.skip_special_tokens, stream=req.stream, rid=req.rid)
        if kind == "chat":
            job.rid = "chatcmpl-" + job.rid if not req.rid else job.rid
        else:
            job.rid = "cmpl-" + job.rid if not req.rid else job.rid
        if not req.stream:
            progress = await run_to_end(job, request)
            shape = proto.chat_completion if kind == "chat" else proto.completion
            return JSONResponse(shape(progress, model, created, req.return_spec_tokens_details))
        require_ready().submit(job)

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
        import sparkit

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
                "version": sparkit.__version__,
                "engine": "sparkit-embedded",
                "launch_command": state.launch_command(),
                "internal_states": [internal],
            }
        )
        return JSONResponse(info)

    async def model_info(request: Request) -> Response:
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
        return PlainTextResponse(state.metrics.render(state.served_name), media_type="text/plain; version=0.0.4")

    async def flush_cache(request: Request) -> Response:
        return PlainTextResponse("Cache flushed.\n")

    routes = [
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

    app = Starlette(
        routes=routes,
        exception_handlers={proto.ApiError: api_error, HTTPException: http_error, Exception: internal_error},
    )
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


# -- main ---------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_arg_parser()
    args = parser.parse_args(argv)
    problems = validate_args(args)
    if problems:
        parser.error("; ".join(problems))
    try:
        model_config = check_checkpoint(Path(args.model_path))
        if args.speculative_draft_model_path:
            check_checkpoint(Path(args.speculative_draft_model_path))
    except CheckpointError as exc:
        print(f"error: cannot load the checkpoint: {exc}", file=sys.stderr, flush=True)
        return 1

    import uvicorn

    state = ServerState(args, argv, model_config)
    app = create_app(state)

    def on_loaded(engine: Any) -> None:
        resolved = state.server_args()
        with state.metrics.lock:  # the engine's resolved values, not the flags' defaults
            state.metrics.context_length = state.context_length
            state.metrics.spec_steps = resolved.get("speculative_num_steps") or 0
            state.metrics.spec_draft_tokens = resolved.get("speculative_num_draft_tokens") or 0
        log("server_args=" + json.dumps(resolved, default=str))
        report = engine.activation_report()
        path = report.write()
        if path is not None:
            log(f"Activation report written to {path}")

    def on_ready() -> None:
        log(READY_LINE)

    def on_failed(exc: BaseException) -> None:
        from sparkit.errors import SparkitError

        if isinstance(exc, SparkitError):  # a user-facing message that names the file; no traceback
            print(f"error: {exc}", file=sys.stderr, flush=True)
        else:
            traceback.print_exception(exc, file=sys.stderr)
            print(f"error: the engine failed to start from {args.model_path}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        state.exit_code = 1
        if state.uvicorn_server is not None:
            state.uvicorn_server.should_exit = True

    state.worker = EngineWorker(
        lambda: load_engine(args, state.served_name, checkpoint_parameters(Path(args.model_path))),
        speculative=state.speculative,
        metrics=state.metrics,
        max_queued=args.max_queued_requests,
        step_delay_s=args.debug_step_delay_ms / 1000.0,
        on_loaded=on_loaded,
        on_ready=on_ready,
        on_failed=on_failed,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=3,
        lifespan="off",
    )
    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            # uvicorn re-raises the signal after its graceful shutdown (exit status -15);
            # a requested, completed shutdown exits 0 so that callers can tell it from a crash.
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()

    server = Server(config)
    state.uvicorn_server = server

    original_startup = server.startup

    async def startup(sockets=None) -> None:
        await original_startup(sockets=sockets)
        if not server.should_exit:
            log(f"Embedded engine HTTP server listening on http://{args.host}:{args.port}")
            state.worker.start()

    server.startup = startup  # type: ignore[method-assign]
    try:
        server.run()
    finally:
        if state.worker is not None:
            state.worker.stop()
            state.worker.thread.join(timeout=5) if state.worker.thread.is_alive() else None
    if state.exit_code == 0 and not server.started:
        return 1
    if state.exit_code == 0:
        log("Shutdown complete.")
    return state.exit_code
