"""Run the decode benchmark against a live server and record everything.

The result is one JSON document (see `BENCH_KIND`), rewritten as the run goes
(at most every few seconds and after each repeat) so that an interrupted run
keeps what it measured; re-running with the same --out and settings resumes
after the last finished repeat (a half-finished repeat is measured again,
because its wall time would be meaningless).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sparkit.bench.limit import against_limit
from sparkit.bench.metrics import BenchMetrics, RequestTimeline, compute_metrics, mean, stdev
from sparkit.bench.workload import Workload, build_workload, tokenizer_from_server, vocabulary_from_server
from sparkit.errors import DataError, EngineError

BENCH_KIND = "sparkit-bench"
BENCH_FORMAT = 1

ProgressFn = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass
class BenchConfig:
    input_len: int = 8192
    output_len: int = 1024
    num_prompts: int = 10
    concurrency: int = 1
    dataset: str = "random"
    warmup: int = 1
    seed: int = 0
    repeats: int = 1
    temperature: float = 0.0  # greedy
    ignore_eos: bool = True


# Figures a user quotes, in display order: (key, unit, lower_is_better).
# Batch-1 figures of servers that are up together share the host: at batch 1 a decode step is
# mostly host time (issue 38: on an H200 the GPU is busy 0.76-0.84 ms of a 2.8-3.0 ms Ling-width
# step), and servers up side by side take it from each other. There the FP8 head read "within
# noise" side by side and +15% one server at a time.
SIDE_BY_SIDE_WARNING = ("measured while {n} other server(s) were up on this machine: batch-1 figures of servers up "
                        "side by side share the host's time between steps (on an H200 an FP8 head's +15% read as "
                        "within noise that way), so a comparison with them may not be sound; measure one server at a "
                        "time (`sparkit down` the others)")


def side_by_side(beside: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The record of the other servers up while a server was measured (None: it was alone)."""
    if not beside:
        return None
    return {"servers": list(beside), "warning": SIDE_BY_SIDE_WARNING.format(n=len(beside))}


HEADLINE: list[tuple[str, str, bool]] = [
    ("tpot_mean_ms", "ms", True),
    ("tpot_median_ms", "ms", True),
    ("tpot_p99_ms", "ms", True),
    ("ttft_mean_ms", "ms", True),
    ("ttft_median_ms", "ms", True),
    ("ttft_p99_ms", "ms", True),
    ("itl_mean_ms", "ms", True),
    ("itl_median_ms", "ms", True),
    ("itl_p99_ms", "ms", True),
    ("output_throughput_tok_s", "tok/s", False),
    ("peak_window_throughput_tok_s", "tok/s (1-s window)", False),
    ("accept_length_mean", "tok/step", False),
    ("server_accept_length", "tok/step", False),
    ("step_time_estimate_ms", "ms (estimate)", True),
]


def headline_figures(metrics: BenchMetrics, server: dict[str, Any] | None = None) -> dict[str, float | None]:
    server = server or {}
    return {
        "tpot_mean_ms": metrics.tpot.mean_ms,
        "tpot_median_ms": metrics.tpot.median_ms,
        "tpot_p99_ms": metrics.tpot.p99_ms,
        "ttft_mean_ms": metrics.ttft.mean_ms,
        "ttft_median_ms": metrics.ttft.median_ms,
        "ttft_p99_ms": metrics.ttft.p99_ms,
        "itl_mean_ms": metrics.itl.mean_ms,
        "itl_median_ms": metrics.itl.median_ms,
        "itl_p99_ms": metrics.itl.p99_ms,
        "output_throughput_tok_s": metrics.output_throughput_tok_s,
        "peak_window_throughput_tok_s": metrics.peak_window_throughput_tok_s,
        "accept_length_mean": metrics.accept_length_mean,
        # The server's own figure over this repeat (its counters), else its running average.
        "server_accept_length": server.get("accept_length_from_counters") or server.get("avg_spec_accept_length"),
        "step_time_estimate_ms": metrics.step_time_estimate_ms,
    }


def summarise(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean over finished repeats of each headline figure, plus the per-repeat values
    (bench compare measures run-to-run noise from them)."""
    done = [r for r in repeats if r.get("complete")]
    per_repeat: dict[str, list[float]] = {}
    for key, _, _ in HEADLINE:
        values = [r["figures"].get(key) for r in done]
        per_repeat[key] = [v for v in values if isinstance(v, (int, float))]
    figures = {k: (mean(v) if v else None) for k, v in per_repeat.items()}
    spread = {k: (stdev(v) if len(v) > 1 else None) for k, v in per_repeat.items()}
    return {"repeats": len(done), "figures": figures, "per_repeat": per_repeat, "stdev": spread}


def host_record() -> dict[str, Any]:
    record: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    try:  # the host detector, when present, knows GPUs and drivers
        from sparkit import host as host_module  # type: ignore[attr-defined]

        detect = getattr(host_module, "detect_host", None) or getattr(host_module, "detect", None)
        if detect is not None:
            detected = detect()
            record["detected"] = detected.to_dict() if hasattr(detected, "to_dict") else asdict(detected)
    except Exception:
        pass
    return record


def versions_record(server_info: dict[str, Any]) -> dict[str, Any]:
    from importlib import metadata

    from sparkit._version import __version__

    found: dict[str, Any] = {"sparkit": __version__, "python": platform.python_version()}
    for package in ("sglang", "torch", "transformers"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    found["server"] = server_info.get("version")
    return found


def server_args_of(server_info: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in server_info.items() if k not in ("internal_states",)}


def internal_state(server_info: dict[str, Any]) -> dict[str, Any]:
    states = server_info.get("internal_states") or [{}]
    return states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}


def counter_snapshot(metrics: dict[str, float], server_info: dict[str, Any]) -> dict[str, Any]:
    return {
        "generation_tokens_total": metrics.get("sglang:generation_tokens_total"),
        "spec_verify_calls_total": metrics.get("sglang:spec_verify_calls_total"),
        "prompt_tokens_total": metrics.get("sglang:prompt_tokens_total"),
        "avg_spec_accept_length": internal_state(server_info).get("avg_spec_accept_length"),
    }


def counter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the server itself counted during one repeat."""

    def diff(key: str) -> float | None:
        a, b = before.get(key), after.get(key)
        return None if a is None or b is None else b - a

    generated, verified = diff("generation_tokens_total"), diff("spec_verify_calls_total")
    return {
        "generation_tokens": generated,
        "spec_verify_calls": verified,
        "prompt_tokens": diff("prompt_tokens_total"),
        "accept_length_from_counters": (generated / verified) if generated and verified else None,
        "avg_spec_accept_length": after.get("avg_spec_accept_length"),
    }


class _DocWriter:
    """Rewrites the result file atomically, at most every `interval` seconds unless forced."""

    def __init__(self, path: Path | None, interval: float = 2.0) -> None:
        self.path, self.interval, self._last = path, interval, 0.0

    def write(self, doc: dict[str, Any], *, force: bool = False) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        from sparkit.paths import ensure_dir, write_atomic

        ensure_dir(self.path.parent)
        write_atomic(self.path, json.dumps(_finite(doc), indent=1, default=str, allow_nan=False))


def _finite(value: Any) -> Any:
    """NaN/inf (e.g. p99 of no samples) become null, so the file is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def load_result(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise DataError(f"{path}: no such bench result") from exc
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not a JSON bench result ({exc.msg} at line {exc.lineno})") from exc
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not a JSON bench result (not UTF-8 text)",
                        hint="produce one with `sparkit bench --out FILE`") from exc
    if not isinstance(doc, dict) or doc.get("kind") != BENCH_KIND:
        raise DataError(f"{path}: not a sparkit bench result (no kind={BENCH_KIND!r})", hint="produce one with `sparkit bench --out FILE`")
    return doc


def _resumable(path: Path | None, config: BenchConfig, url: str) -> list[dict[str, Any]]:
    if path is None or not path.exists():
        return []
    try:
        doc = load_result(path)
    except DataError:
        return []
    if doc.get("config") != asdict(config) or doc.get("server", {}).get("url") != url:
        return []
    return [r for r in doc.get("repeats", []) if r.get("complete")]


async def _one_request(client: Any, prompt: Any, sampling: dict[str, Any]) -> RequestTimeline:
    from sparkit.client import Generation

    t0 = time.perf_counter()
    try:
        async for item in client.stream_generate(sampling_params=sampling, **prompt.request_fields()):
            if isinstance(item, Generation):
                return RequestTimeline.from_generation(item)
    except EngineError as exc:
        return RequestTimeline(t_start=t0, t_end=time.perf_counter(), chunks=[], output_tokens=0, error=str(exc))
    return RequestTimeline(t_start=t0, t_end=time.perf_counter(), chunks=[], output_tokens=0, error="stream ended without a result")


async def _run_requests(
    client: Any,
    workload: Workload,
    sampling: dict[str, Any],
    concurrency: int,
    on_done: Callable[[RequestTimeline], None],
) -> tuple[list[RequestTimeline], float, float]:
    semaphore = asyncio.Semaphore(max(1, concurrency))
    results: list[RequestTimeline | None] = [None] * len(workload.prompts)

    async def worker(index: int) -> None:
        async with semaphore:
            timeline = await _one_request(client, workload.prompts[index], sampling)
            results[index] = timeline
            on_done(timeline)

    t_begin = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(len(workload.prompts))))
    t_finish = time.perf_counter()
    return [r for r in results if r is not None], t_begin, t_finish


async def run_bench(
    url: str,
    config: BenchConfig,
    *,
    api_key: str | None = None,
    out_path: Path | None = None,
    recipe: dict[str, Any] | None = None,
    run_id: str | None = None,
    on_progress: ProgressFn | None = None,
    beside: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Benchmark the server at `url`; return (and keep writing to `out_path`) the result document.
    `beside`: the other servers up meanwhile (recorded, with the warning that goes with them)."""
    from sparkit.client import EngineClient

    progress = on_progress or (lambda phase, done, total: None)
    writer = _DocWriter(out_path)
    async with EngineClient(url, api_key=api_key) as client:
        server_info = await client.server_info()
        model_info = await _model_info(client)
        vocabulary, tokenizer = _prompt_sources(config, model_info, server_info)
        warm = _warm_workload(config, vocabulary, tokenizer)
        sampling = _sampling(config)
        kept = _resumable(out_path, config, url)
        doc: dict[str, Any] = {
            "kind": BENCH_KIND,
            "format": BENCH_FORMAT,
            "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "config": asdict(config),
            "workload": None,
            "server": _server_record(url, run_id, model_info, server_info),
            "recipe": recipe,
            "host": host_record(),
            "versions": versions_record(server_info),
            "repeats": list(kept),
            "summary": summarise(kept),
            "limit": None,  # the recipe's bandwidth limit at this workload (sparkit.bench.limit), once measured
            "side_by_side": side_by_side(beside or []),
            "complete": False,
        }
        for index in range(len(kept), config.repeats):
            # Each repeat sends the same prompts: repeats measure run-to-run noise, not prompt variety.
            workload = build_workload(
                config.dataset, count=config.num_prompts, input_len=config.input_len,
                output_len=config.output_len, seed=config.seed, vocabulary=vocabulary, tokenizer=tokenizer,
            )
            doc["workload"] = {
                "dataset": workload.dataset,
                "synthetic": workload.synthetic,
                "description": workload.description,
                **workload.details,
            }
            if config.warmup > 0:
                await _warm_up(client, config, warm, sampling, progress)
            await _measure_repeat(client, config, workload, sampling, doc, writer, index, progress)
        doc["complete"] = True
        doc["summary"] = summarise(doc["repeats"])
        doc["limit"] = against_limit(doc)
        writer.write(doc, force=True)
    return _finite(doc)


async def _model_info(client: Any) -> dict[str, Any]:
    try:
        return await client.model_info()
    except EngineError:
        return {}


def _prompt_sources(config: BenchConfig, model_info: dict[str, Any], server_info: dict[str, Any]) -> tuple[Any, Any]:
    """The served model's vocabulary (for random prompts) and tokenizer (for a profile's prompts)."""
    vocabulary = vocabulary_from_server(model_info, server_info) if config.dataset == "random" else None
    tokenizer = tokenizer_from_server(model_info, server_info) if config.dataset.startswith("profile:") else None
    return vocabulary, tokenizer


def _warm_workload(config: BenchConfig, vocabulary: Any, tokenizer: Any) -> Workload:
    # Warm-up prompts use a different seed so they never prime a cache for measured prompts.
    return build_workload(config.dataset, count=max(config.warmup, 1), input_len=config.input_len,
                          output_len=config.output_len, seed=config.seed + 7919, vocabulary=vocabulary,
                          tokenizer=tokenizer)


def _sampling(config: BenchConfig) -> dict[str, Any]:
    return {"temperature": config.temperature, "max_new_tokens": config.output_len, "ignore_eos": config.ignore_eos}


def _server_record(url: str, run_id: str | None, model_info: dict[str, Any], server_info: dict[str, Any]) -> dict[str, Any]:
    return {
        "url": url,
        "run_id": run_id,
        "model": model_info.get("model_path") or server_info.get("model_path"),
        "served_model_name": server_info.get("served_model_name"),
        "server_args": server_args_of(server_info),
    }


async def _warm_up(client: Any, config: BenchConfig, warm: Workload, sampling: dict[str, Any], progress: ProgressFn) -> None:
    warm_prompts = Workload(warm.dataset, warm.prompts[: config.warmup], warm.output_len, warm.synthetic, "warm-up")
    done_warm = 0

    def warm_done(_: RequestTimeline) -> None:
        nonlocal done_warm
        done_warm += 1
        progress("warmup", done_warm, config.warmup)

    progress("warmup", 0, config.warmup)
    await _run_requests(client, warm_prompts, sampling, config.concurrency, warm_done)


async def _measure_repeat(client: Any, config: BenchConfig, workload: Workload, sampling: dict[str, Any],
                          doc: dict[str, Any], writer: _DocWriter, index: int, progress: ProgressFn) -> None:
    """One measured repeat, appended to doc["repeats"]; the document is rewritten as requests finish."""
    before = counter_snapshot(await client.metrics(), await client.server_info())
    repeat: dict[str, Any] = {"index": index, "complete": False, "requests": []}
    doc["repeats"].append(repeat)
    label = f"repeat {index + 1}/{config.repeats}" if config.repeats > 1 else "bench"

    def request_done(timeline: RequestTimeline) -> None:
        repeat["requests"].append(timeline.to_dict())
        progress(label, len(repeat["requests"]), config.num_prompts)
        writer.write(doc)

    progress(label, 0, config.num_prompts)
    timelines, t_begin, t_finish = await _run_requests(
        client, workload, sampling, config.concurrency, request_done
    )
    after_info = await client.server_info()
    after = counter_snapshot(await client.metrics(), after_info)
    metrics = compute_metrics(timelines, t_begin=t_begin, t_finish=t_finish)
    counters = counter_delta(before, after)
    repeat.update(
        complete=True,
        requests=[t.to_dict() for t in timelines],
        metrics=metrics.to_dict(),
        server_counters=counters,
        figures=headline_figures(metrics, counters),
    )
    doc["summary"] = summarise(doc["repeats"])
    writer.write(doc, force=True)


@dataclass
class BenchTarget:
    url: str
    api_key: str | None = None
    out_path: Path | None = None
    recipe: dict[str, Any] | None = None
    run_id: str | None = None


async def run_interleaved(
    targets: list[BenchTarget],
    config: BenchConfig,
    *,
    on_progress: ProgressFn | None = None,
) -> list[dict[str, Any]]:
    """Benchmark several servers in one run, interleaved request by request.

    On a shared machine the load drifts over minutes; sending prompt i to every
    server before prompt i+1 (rotating who goes first) puts that drift on all of
    them alike, so their differences are comparable (docs/protocols.md, "Timing on a
    shared machine"). Only one request is in flight at a time. Each server's
    throughput is its output tokens over the time its own requests took, and the
    peak 1-second window is not defined here (the windows mix servers)."""
    from contextlib import AsyncExitStack

    from sparkit.client import EngineClient

    if config.concurrency != 1:
        raise EngineError("interleaved benchmarking runs at concurrency 1")
    progress = on_progress or (lambda phase, done, total: None)
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(EngineClient(t.url, api_key=t.api_key)) for t in targets]
        infos = [await c.server_info() for c in clients]
        models = [await _model_info(c) for c in clients]
        vocabulary, tokenizer = _prompt_sources(config, models[0], infos[0])
        workload = build_workload(config.dataset, count=config.num_prompts, input_len=config.input_len,
                                  output_len=config.output_len, seed=config.seed, vocabulary=vocabulary,
                                  tokenizer=tokenizer)
        warm = _warm_workload(config, vocabulary, tokenizer)
        sampling = _sampling(config)
        docs = []
        for t, info, model in zip(targets, infos, models):
            docs.append({
                "kind": BENCH_KIND, "format": BENCH_FORMAT,
                "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                "config": asdict(config),
                "workload": {"dataset": workload.dataset, "synthetic": workload.synthetic,
                             "description": workload.description + f"; interleaved with {len(targets) - 1} other server(s)",
                             "interleaved_with": len(targets) - 1, **workload.details},
                "server": _server_record(t.url, t.run_id, model, info),
                "recipe": t.recipe, "host": host_record(), "versions": versions_record(info),
                "repeats": [], "summary": summarise([]), "complete": False,
                "side_by_side": side_by_side([{"url": o.url, "run": o.run_id} for o in targets if o is not t]),
            })
        writers = [_DocWriter(t.out_path) for t in targets]
        n = len(targets)
        for _ in range(config.warmup):
            for client in clients:
                await _one_request(client, warm.prompts[0], sampling)
        total = config.repeats * config.num_prompts * n
        done = 0
        progress("interleaved", 0, total)
        for index in range(config.repeats):
            befores = [counter_snapshot(await c.metrics(), await c.server_info()) for c in clients]
            timelines: list[list[RequestTimeline]] = [[] for _ in targets]
            for k in range(config.num_prompts):
                for j in range(n):
                    s = (k + index + j) % n  # rotate who goes first
                    timelines[s].append(await _one_request(clients[s], workload.prompts[k], sampling))
                    done += 1
                    progress("interleaved", done, total)
            for s, client in enumerate(clients):
                after = counter_snapshot(await client.metrics(), await client.server_info())
                docs[s]["repeats"].append(_interleaved_repeat(index, timelines[s], counter_delta(befores[s], after)))
                docs[s]["summary"] = summarise(docs[s]["repeats"])
                writers[s].write(docs[s], force=True)
        for s in range(n):
            docs[s]["complete"] = True
            docs[s]["limit"] = against_limit(docs[s])
            writers[s].write(docs[s], force=True)
    return [_finite(d) for d in docs]


def _interleaved_repeat(index: int, timelines: list[RequestTimeline], counters: dict[str, Any]) -> dict[str, Any]:
    """One server's repeat of an interleaved run: its throughput is over its own requests' time."""
    metrics = compute_metrics(timelines)
    busy = sum(t.latency for t in timelines if t.ok)
    metrics = dataclasses.replace(
        metrics,
        duration_s=busy,
        output_throughput_tok_s=metrics.total_output_tokens / busy if busy > 0 else math.nan,
        request_throughput_req_s=metrics.completed / busy if busy > 0 else math.nan,
        peak_window_throughput_tok_s=math.nan,
        notes=metrics.notes + ["interleaved: throughput = output tokens / this server's request time; no 1-s window peak"],
    )
    return {
        "index": index, "complete": True, "requests": [t.to_dict() for t in timelines],
        "metrics": metrics.to_dict(), "server_counters": counters,
        "figures": headline_figures(metrics, counters),
    }
