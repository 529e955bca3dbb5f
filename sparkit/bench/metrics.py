"""Decode-benchmark metrics as pure functions over request timelines.

Definitions follow sglang.bench_serving (see docs/protocols.md):

- TTFT: request start to the first non-empty streamed chunk.
- TPOT per request: (latency - TTFT) / (output_tokens - 1); it excludes TTFT.
- ITL: the gap between consecutive chunks, spread evenly over the tokens the
  later chunk carries (a speculative verify step sends several tokens at once).
- Output throughput: total output tokens / total benchmark wall time.
- Peak throughput: the most output tokens that arrived in one fixed 1-second
  window of a grid anchored at the benchmark start. A window statistic: it
  carries phase noise of about +-5%, so it is reported, never optimised for.
- Accept length: completion_tokens / spec_verify_ct per request (mean over
  requests), and the server's own average when it reports one.
- Step-time estimate: mean TPOT x mean accept length (1 without speculation).
  A derived estimate, not a measurement.

Times are seconds in the timelines and milliseconds in the summaries.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

WINDOW_S = 1.0


@dataclass
class ChunkArrival:
    t: float  # arrival time (same clock as the request's t_start)
    new_tokens: int


@dataclass
class RequestTimeline:
    """One finished request as the benchmark saw it."""

    t_start: float
    t_end: float
    chunks: list[ChunkArrival]
    output_tokens: int
    prompt_tokens: int = 0
    spec_verify_ct: int | None = None  # verify steps the server ran for this request
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.output_tokens > 0 and bool(self.chunks)

    @property
    def ttft(self) -> float | None:
        return self.chunks[0].t - self.t_start if self.chunks else None

    @property
    def latency(self) -> float:
        return self.t_end - self.t_start

    @property
    def tpot(self) -> float | None:
        """(latency - TTFT) / (output_tokens - 1); None for a single-token reply."""
        if not self.chunks or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        """Inter-token latencies: each chunk gap divided evenly over the chunk's tokens."""
        values: list[float] = []
        for prev, cur in zip(self.chunks, self.chunks[1:]):
            if cur.new_tokens <= 0:
                continue
            gap = (cur.t - prev.t) / cur.new_tokens
            values.extend([gap] * cur.new_tokens)
        return values

    @property
    def accept_length(self) -> float | None:
        if self.spec_verify_ct:
            return self.output_tokens / self.spec_verify_ct
        return None

    @property
    def step_time(self) -> float | None:
        """This request's TPOT x accept length (1 without speculation)."""
        tpot = self.tpot
        if tpot is None:
            return None
        return tpot * (self.accept_length or 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "t_start": self.t_start,
            "t_end": self.t_end,
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "spec_verify_ct": self.spec_verify_ct,
            "error": self.error,
            # Compact: [[t, n], ...] keeps the file small for 1024-token replies.
            "chunks": [[c.t, c.new_tokens] for c in self.chunks],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestTimeline:
        return cls(
            t_start=data["t_start"],
            t_end=data["t_end"],
            chunks=[ChunkArrival(t=t, new_tokens=n) for t, n in data.get("chunks", [])],
            output_tokens=data["output_tokens"],
            prompt_tokens=data.get("prompt_tokens", 0),
            spec_verify_ct=data.get("spec_verify_ct"),
            error=data.get("error"),
        )

    @classmethod
    def from_generation(cls, generation: Any) -> RequestTimeline:
        """From a sparkit.client.Generation (streamed)."""
        return cls(
            t_start=generation.t_start,
            t_end=generation.t_end,
            chunks=[ChunkArrival(t=c.t, new_tokens=c.new_tokens) for c in generation.chunks],
            output_tokens=generation.completion_tokens,
            prompt_tokens=generation.prompt_tokens,
            spec_verify_ct=generation.spec_verify_ct,
        )


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def stdev(values: list[float]) -> float:
    """Sample standard deviation (n - 1); nan below two values."""
    if len(values) < 2:
        return math.nan
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


@dataclass
class Distribution:
    """mean / median / p99 / std in milliseconds, and how many samples."""

    mean_ms: float
    median_ms: float
    p99_ms: float
    std_ms: float
    n: int

    @classmethod
    def of_seconds(cls, values: list[float]) -> Distribution:
        ms = [v * 1000.0 for v in values]
        return cls(
            mean_ms=mean(ms),
            median_ms=percentile(ms, 50),
            p99_ms=percentile(ms, 99),
            std_ms=stdev(ms),
            n=len(ms),
        )


def window_throughputs(requests: list[RequestTimeline], t0: float, window: float = WINDOW_S) -> list[int]:
    """Output tokens that arrived in each fixed window [t0 + k*w, t0 + (k+1)*w).

    Every token of a chunk counts at the chunk's arrival time. Trailing
    partial windows count as they are (they can only lower the peak)."""
    counts: dict[int, int] = {}
    for request in requests:
        for chunk in request.chunks:
            index = int((chunk.t - t0) // window)
            counts[index] = counts.get(index, 0) + chunk.new_tokens
    if not counts:
        return []
    last = max(counts)
    return [counts.get(i, 0) for i in range(0, last + 1)]


@dataclass
class BenchMetrics:
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    duration_s: float  # benchmark wall time (first request start to last request end)
    output_throughput_tok_s: float  # total output tokens / wall time
    peak_window_throughput_tok_s: float  # max over fixed 1-s windows (a window statistic)
    request_throughput_req_s: float
    ttft: Distribution
    tpot: Distribution  # excludes TTFT
    itl: Distribution  # chunk gaps spread over multi-token chunks
    e2e_latency: Distribution
    accept_length_mean: float | None  # mean over requests of completion_tokens / spec_verify_ct
    accept_length_total: float | None  # sum(completion_tokens) / sum(spec_verify_ct)
    step_time_estimate_ms: float  # mean TPOT x mean accept length (1 when not speculating)
    step_time_per_request_ms: Distribution  # TPOT_i x accept_i, for noise estimates
    window_s: float = WINDOW_S
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchMetrics:
        data = dict(data)
        for key in ("ttft", "tpot", "itl", "e2e_latency", "step_time_per_request_ms"):
            data[key] = Distribution(**data[key])
        return cls(**data)


def compute_metrics(
    requests: list[RequestTimeline],
    *,
    t_begin: float | None = None,
    t_finish: float | None = None,
) -> BenchMetrics:
    """Aggregate metrics over the benchmark's requests.

    `t_begin`/`t_finish` bound the benchmark wall time; by default the first
    request start and the last request end."""
    ok = [r for r in requests if r.ok]
    failed = len(requests) - len(ok)
    if t_begin is None:
        t_begin = min((r.t_start for r in requests), default=0.0)
    if t_finish is None:
        t_finish = max((r.t_end for r in requests), default=t_begin)
    duration = max(t_finish - t_begin, 0.0)
    total_out = sum(r.output_tokens for r in ok)
    total_in = sum(r.prompt_tokens for r in ok)

    tpots = [r.tpot for r in ok if r.tpot is not None]
    accepts = [r.accept_length for r in ok if r.accept_length is not None]
    verify_total = sum(r.spec_verify_ct or 0 for r in ok if r.spec_verify_ct)
    out_with_verify = sum(r.output_tokens for r in ok if r.spec_verify_ct)
    accept_mean = mean(accepts) if accepts else None
    accept_total = out_with_verify / verify_total if verify_total else None
    tpot_dist = Distribution.of_seconds(tpots)
    itls = [v for r in ok for v in r.itls]
    windows = window_throughputs(ok, t_begin)
    notes: list[str] = []
    if failed:
        notes.append(f"{failed} request(s) failed and are excluded")
    if accepts and len(accepts) < len(ok):
        notes.append("some requests reported no spec_verify_ct; accept length averages the others")
    return BenchMetrics(
        completed=len(ok),
        failed=failed,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        duration_s=duration,
        output_throughput_tok_s=total_out / duration if duration > 0 else math.nan,
        peak_window_throughput_tok_s=max(windows) / WINDOW_S if windows else math.nan,
        request_throughput_req_s=len(ok) / duration if duration > 0 else math.nan,
        ttft=Distribution.of_seconds([r.ttft for r in ok if r.ttft is not None]),
        tpot=tpot_dist,
        itl=Distribution.of_seconds(itls),
        e2e_latency=Distribution.of_seconds([r.latency for r in ok]),
        accept_length_mean=accept_mean,
        accept_length_total=accept_total,
        step_time_estimate_ms=tpot_dist.mean_ms * (accept_mean if accept_mean else 1.0),
        step_time_per_request_ms=Distribution.of_seconds([r.step_time for r in ok if r.step_time is not None]),
        notes=notes,
    )
