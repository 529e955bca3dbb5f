"""The counters behind /metrics and /server_info, in SGLang's metric names."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from sparkit.engines.embedded.responses import RequestProgress

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


# SGLang's label sets (sglang/srt/observability/metrics_collector.py): the scheduler's gauges carry
# the parallel ranks, the tokenizer's counters and histograms only the model and engine type, and
# its request counters split streamed requests from the others. One process, one rank: all 0.
ENGINE_TYPE = "unified"  # DisaggregationMode.to_engine_type of no disaggregation
STREAMING = (False, True)


class ServerMetrics:
    """Counters behind /metrics and /server_info. Written by the worker, read by the event loop.

    Counters are exact and count user requests only (warm-up and /health_generate
    are excluded), at the moment a request finishes, with the completion tokens the
    client was sent, so a benchmark can reconcile its own counts with them. Each item of a
    batch and each of n samples is a request, as in SGLang.
    """

    def __init__(self, speculative: bool, context_length: int | None, spec_steps: int | None, spec_draft_tokens: int | None) -> None:
        self.lock = threading.Lock()
        self.speculative = speculative
        self.context_length = context_length or 0
        self.spec_steps = spec_steps or 0
        self.spec_draft_tokens = spec_draft_tokens or 0
        self.requests = {streaming: 0 for streaming in STREAMING}
        self.prompt_tokens = {streaming: 0 for streaming in STREAMING}
        self.generation_tokens = {streaming: 0 for streaming in STREAMING}
        self.num_aborted_requests_total = 0
        self.num_so_requests_total = 0  # structured output: with a grammar
        self.spec_verify_calls_total = 0
        self.spec_tokens_in_verified_requests = 0  # completion tokens of requests that speculated
        self.spec_accepted_drafts_total = 0
        self.spec_proposed_drafts_total = 0
        self.num_running_reqs = 0
        self.num_queue_reqs = 0
        self.gen_throughput = 0.0
        self.spec_accept_length = 0.0
        self.spec_accept_rate = 0.0
        self.ttft = {streaming: Histogram(_LATENCY_BUCKETS) for streaming in STREAMING}
        self.e2e = {streaming: Histogram(_LATENCY_BUCKETS) for streaming in STREAMING}
        self.queue_time = Histogram(_LATENCY_BUCKETS)
        self.itl = Histogram(_ITL_BUCKETS)

    # totals over both label values (what /server_info and the tests read)
    @property
    def num_requests_total(self) -> int:
        return sum(self.requests.values())

    @property
    def prompt_tokens_total(self) -> int:
        return sum(self.prompt_tokens.values())

    @property
    def generation_tokens_total(self) -> int:
        return sum(self.generation_tokens.values())

    def record_request(self, progress: RequestProgress, queue_seconds: float, aborted: bool, *,
                       streaming: bool = False, grammar: bool = False) -> None:
        with self.lock:
            self.requests[streaming] += 1
            if aborted:
                self.num_aborted_requests_total += 1
            if grammar:
                self.num_so_requests_total += 1
            self.prompt_tokens[streaming] += progress.prompt_tokens
            self.generation_tokens[streaming] += progress.completion_tokens
            self.spec_verify_calls_total += progress.spec_verify_ct
            if progress.spec_verify_ct:
                self.spec_tokens_in_verified_requests += progress.completion_tokens
            self.spec_accepted_drafts_total += progress.spec_num_correct_drafts
            self.spec_proposed_drafts_total += progress.spec_num_proposed_drafts
            if progress.first_token_latency is not None:
                self.ttft[streaming].observe(progress.first_token_latency)
            if progress.e2e_latency is not None:
                self.e2e[streaming].observe(progress.e2e_latency)
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
        """Prometheus text exposition, with sglang's metric names and label sets."""
        tokenizer = f'model_name="{_escape_label(model_name)}",engine_type="{ENGINE_TYPE}"'
        scheduler = tokenizer + ',tp_rank="0",pp_rank="0",moe_ep_rank="0"'
        out: list[str] = []

        def head(name: str, kind: str, help_: str) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")

        def metric(name: str, kind: str, help_: str, value: float, labels: str = tokenizer) -> None:
            head(name, kind, help_)
            out.append(f"{name}{{{labels}}} {_num(value)}")

        def per_stream(name: str, help_: str, values: dict[bool, float]) -> None:
            head(name, "counter", help_)
            for streaming in STREAMING:
                out.append(f'{name}{{{tokenizer},is_streaming="{str(streaming).lower()}"}} {_num(values[streaming])}')

        def samples(name: str, labels: str, hist: Histogram) -> None:
            for bound, count in zip(hist.buckets, hist.counts):
                out.append(f'{name}_bucket{{{labels},le="{_num(bound)}"}} {count}')
            out.append(f'{name}_bucket{{{labels},le="+Inf"}} {hist.total}')
            out.append(f"{name}_sum{{{labels}}} {_num(hist.sum)}")
            out.append(f"{name}_count{{{labels}}} {hist.total}")

        def histogram(name: str, help_: str, hist: Histogram | dict[bool, Histogram], labels: str = tokenizer) -> None:
            head(name, "histogram", help_)
            if isinstance(hist, dict):
                for streaming in STREAMING:
                    samples(name, f'{labels},is_streaming="{str(streaming).lower()}"', hist[streaming])
            else:
                samples(name, labels, hist)

        with self.lock:
            metric("sglang:num_running_reqs", "gauge", "The number of running requests.", self.num_running_reqs, scheduler)
            metric("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", self.num_queue_reqs, scheduler)
            metric("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", self.gen_throughput, scheduler)
            metric("sglang:context_len", "gauge", "Maximum context length.", self.context_length, scheduler)
            metric("sglang:spec_accept_length", "gauge", "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).", self.spec_accept_length, scheduler)
            metric("sglang:spec_accept_rate", "gauge", "Speculative acceptance rate (accepted drafts / proposed drafts).", self.spec_accept_rate, scheduler)
            metric("sglang:spec_num_steps", "gauge", "Speculative decoding num steps.", self.spec_steps, scheduler)
            metric("sglang:spec_num_draft_tokens", "gauge", "Speculative decoding num draft tokens.", self.spec_draft_tokens, scheduler)
            per_stream("sglang:num_requests_total", "Number of requests processed.", self.requests)
            metric("sglang:num_aborted_requests_total", "counter", "Number of requests aborted.", self.num_aborted_requests_total)
            metric("sglang:num_so_requests_total", "counter", "Number of structured output requests processed.", self.num_so_requests_total)
            per_stream("sglang:prompt_tokens_total", "Number of prefill tokens processed.", self.prompt_tokens)
            per_stream("sglang:generation_tokens_total", "Number of generation tokens processed.", self.generation_tokens)
            # SGLang counts cached tokens by source only when there are some: none here (no prefix cache)
            head("sglang:cached_tokens_total", "counter", "Number of cached prompt tokens by source (device/host/storage).")
            metric("sglang:spec_verify_calls_total", "counter", "Number of speculative decoding verification calls.", self.spec_verify_calls_total)
            histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft)
            histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", self.e2e)
            histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.itl)
            histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", self.queue_time, scheduler)
        return "\n".join(out) + "\n"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e15):
        return str(int(value)) + ".0" if isinstance(value, float) else str(value)
    return repr(float(value))
