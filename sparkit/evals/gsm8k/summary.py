"""The summary of a GSM8K results file: accuracy with its interval, invalid and truncated answers,
throughput over the sessions' wall time, accept length, and the server's arguments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sparkit.engines.base import shown_args
from sparkit.evals.gsm8k.data import Question
from sparkit.evals.gsm8k.results_file import ResultsFile
from sparkit.evals.stats import proportion
from sparkit.paths import write_atomic


def summarize(results: ResultsFile, questions: list[Question] | None = None) -> dict[str, Any]:
    """The summary of a results file, over the selected questions (all in the file by default).

    Throughput is total output tokens over wall time, where wall time sums each session's span
    (first request start to last finish), so time between a crash and --resume is not counted.
    """
    header = results.header or {}
    last_header = results.headers[-1] if results.headers else header
    if questions is not None:
        ids = [q.id for q in questions]
        rows = [results.results[i] for i in ids if i in results.results]
        total = len(ids)
    else:
        rows = [results.results[i] for i in sorted(results.results)]
        total = len(rows)
    n = len(rows)
    strict_ok = sum(bool(r["correct"]["strict"]) for r in rows)
    flex_ok = sum(bool(r["correct"]["flexible"]) for r in rows)
    strict_invalid = sum(r["strict"] is None for r in rows)
    flex_invalid = sum(r["flexible"] is None for r in rows)
    truncated = sum(r.get("finish_reason") == "length" for r in rows)
    tokens = sum(int(r.get("completion_tokens") or 0) for r in rows)
    latencies = [float(r["latency_s"]) for r in rows if r.get("latency_s") is not None]

    spans: dict[str, tuple[float, float]] = {}
    concurrencies: set[int] = set()
    for r in rows:
        s = r.get("session", "")
        start, end = float(r.get("started_at", 0)), float(r.get("finished_at", 0))
        lo, hi = spans.get(s, (start, end))
        spans[s] = (min(lo, start), max(hi, end))
        if r.get("concurrency") is not None:
            concurrencies.add(int(r["concurrency"]))
    wall = sum(hi - lo for lo, hi in spans.values())

    verify_rows = [r for r in rows if r.get("spec_verify_ct")]
    if verify_rows:
        accept = sum(int(r["completion_tokens"]) for r in verify_rows) / sum(int(r["spec_verify_ct"]) for r in verify_rows)
    else:
        values = [float(r["accept_length"]) for r in rows if r.get("accept_length") is not None]
        accept = sum(values) / len(values) if values else None

    server_args = last_header.get("server_args") or {}
    return {
        "results_file": str(results.path),
        "n": n,
        "total": total,
        "complete": n == total,
        "accuracy": {
            "strict": proportion(strict_ok, n).as_dict(),
            "flexible": proportion(flex_ok, n).as_dict(),
        },
        "invalid_rate": {"strict": strict_invalid / n if n else 0.0, "flexible": flex_invalid / n if n else 0.0},
        "truncated": truncated,
        "mean_latency_s": sum(latencies) / len(latencies) if latencies else None,
        "output_tokens": tokens,
        "wall_s": wall,
        "output_throughput_tok_s": tokens / wall if wall > 0 else None,
        "concurrency": sorted(concurrencies)[0] if len(concurrencies) == 1 else sorted(concurrencies),
        "mean_accept_length": accept,
        "sessions": len(results.headers),
        "settings": header.get("settings"),
        "settings_hash": header.get("settings_hash"),
        "recipe": last_header.get("recipe"),
        "run_id": last_header.get("run_id"),
        "url": last_header.get("url"),
        "model": last_header.get("model"),
        # the arguments that say which stack answered (the settings tables' labelled rows)
        "server_args": {k: server_args[k] for k in shown_args() if k in server_args},
        "server_args_full": server_args,
    }


def summary_path_for(results_path: Path) -> Path:
    return Path(results_path).with_suffix(".summary.json")


def write_summary(summary: dict[str, Any], path: Path) -> None:
    write_atomic(path, json.dumps(summary, indent=2, default=str))
