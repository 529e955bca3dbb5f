"""GSM8K from the Hugging Face hub, as JSON, without `datasets` or pyarrow.

The hub stores openai/gsm8k as parquet; its dataset viewer serves the same rows as JSON pages:

    GET {rows_url}?dataset=openai%2Fgsm8k&config=main&split=test&offset=0&length=100
    -> {"features": [...], "rows": [{"row_idx": 0, "row": {"question": ..., "answer": ...},
        "truncated_cells": []}, ...], "num_rows_total": 1319, "num_rows_per_page": 100, "partial": false}

Both splits are paged through (100 rows per page is the viewer's maximum), checked (row order,
row counts, no truncated cells) and written as the original release's JSONL (one
{"question", "answer"} object per line) atomically into the cache, so a later run reuses them
without a request.

Environment:
    SPARKIT_GSM8K_ROWS_URL  the viewer's /rows endpoint (default below; tests point it at a local server)
    HF_HUB_OFFLINE=1        no network attempt at all: a DataError that points to --data
    HF_ENDPOINT             the hub host (mirror) named in messages; the viewer API has its own host
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from sparkit.errors import DataError

DATASET = "openai/gsm8k"
CONFIG = "main"
SPLIT_SIZES = {"test": 1319, "train": 7473}
DEFAULT_ROWS_URL = "https://datasets-server.huggingface.co/rows"
ROWS_URL_ENV = "SPARKIT_GSM8K_ROWS_URL"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
PAGE_LENGTH = 100  # the viewer refuses more per request
MAX_RETRY_AFTER_S = 10.0

# Worth another try: the viewer answers these while it is busy or being redeployed.
_TRANSIENT_STATUS = {429, 500, 502, 503, 504}
_DATA_HINT = ("offline? leave out --from-hub: sparkit ships the same files; or pass --data "
              "/path/to/gsm8k/test.jsonl (train.jsonl beside it)")


@dataclass(frozen=True)
class DownloadProgress:
    """One page arrived: `done` of `total` rows over all splits being downloaded."""

    split: str
    done: int
    total: int


DownloadProgressFn = Callable[[DownloadProgress], None]


def rows_url() -> str:
    return os.environ.get(ROWS_URL_ENV) or DEFAULT_ROWS_URL


def hub_offline() -> bool:
    # The same truthy spellings huggingface_hub accepts.
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def dataset_page_url() -> str:
    endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")
    return f"{endpoint}/datasets/{DATASET}"


def page_url(base_url: str, split: str, offset: int, length: int = PAGE_LENGTH) -> str:
    query = urlencode({"dataset": DATASET, "config": CONFIG, "split": split, "offset": offset, "length": length})
    return f"{base_url}{'&' if '?' in base_url else '?'}{query}"


def _retry_after(response: Any) -> float | None:
    """The server's Retry-After in seconds, capped: a rate-limited hub says how long to wait."""
    try:
        return min(max(float(response.headers.get("Retry-After", "")), 0.0), MAX_RETRY_AFTER_S)
    except ValueError:
        return None


def _get_json(client: Any, url: str, *, retries: int, backoff_s: float) -> dict[str, Any]:
    """GET one page; transient failures (timeouts, 429/5xx) are retried with a doubling backoff.
    A refused connection or a DNS failure is not retried: that is being offline, and saying so
    at once beats making the user wait."""
    import httpx

    for attempt in range(retries + 1):
        last = attempt == retries
        try:
            response = client.get(url)
        except (httpx.ConnectError, httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise DataError(f"cannot download GSM8K from the Hugging Face hub: {url}: {exc}", hint=_DATA_HINT) from exc
        except httpx.TransportError as exc:  # timeouts, dropped connections
            if last:
                raise DataError(
                    f"cannot download GSM8K from the Hugging Face hub: {url}: {type(exc).__name__}: {exc} "
                    f"(after {retries + 1} attempts)",
                    hint=_DATA_HINT,
                ) from exc
        else:
            if response.status_code == 200:
                try:
                    body = response.json()
                except ValueError as exc:
                    raise DataError(
                        f"cannot download GSM8K: {url} did not answer JSON (a captive portal or proxy page?)", hint=_DATA_HINT
                    ) from exc
                if not isinstance(body, dict):
                    raise DataError(f"cannot download GSM8K: {url} answered {type(body).__name__}, expected an object")
                return body
            if response.status_code not in _TRANSIENT_STATUS or last:
                detail = response.text.strip().replace("\n", " ")[:200]
                tries = f" (after {retries + 1} attempts)" if response.status_code in _TRANSIENT_STATUS else ""
                raise DataError(
                    f"cannot download GSM8K from the Hugging Face hub: {url}: HTTP {response.status_code}{tries}"
                    + (f": {detail}" if detail else ""),
                    hint=_DATA_HINT,
                )
            time.sleep(_retry_after(response) or backoff_s * (2**attempt))
            continue
        time.sleep(backoff_s * (2**attempt))
    raise AssertionError("unreachable")  # pragma: no cover


def fetch_split(
    split: str,
    *,
    client: Any,
    base_url: str,
    on_page: Callable[[int], None] | None = None,
    retries: int = 2,
    backoff_s: float = 0.5,
) -> list[dict[str, str]]:
    """Every row of one split, in order, as {"question", "answer"}; DataError if the pages
    disagree with each other or with the split's published size."""
    expected = SPLIT_SIZES[split]
    rows: list[dict[str, str]] = []
    while len(rows) < expected:
        url = page_url(base_url, split, len(rows))
        body = _get_json(client, url, retries=retries, backoff_s=backoff_s)
        total = body.get("num_rows_total")
        if total != expected:
            raise DataError(
                f"the hub's GSM8K {split} split has {total} rows, expected {expected} ({url})",
                hint=f"has {DATASET} changed? pass --data with a copy of the original test.jsonl",
            )
        if body.get("partial"):
            raise DataError(f"the hub's viewer only has part of the GSM8K {split} split ({url})", hint=_DATA_HINT)
        page = body.get("rows")
        if not isinstance(page, list) or not page:
            raise DataError(f"the hub's viewer sent no rows for GSM8K {split} at offset {len(rows)} ({url})", hint=_DATA_HINT)
        for item in page:
            index = len(rows)
            row = item.get("row") if isinstance(item, dict) else None
            if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not isinstance(row.get("answer"), str):
                raise DataError(f"the hub's GSM8K {split} row {index} is not {{question: str, answer: str}} ({url})")
            if item.get("row_idx", index) != index:
                raise DataError(f"the hub's GSM8K {split} rows are out of order: row_idx {item.get('row_idx')} at {index} ({url})")
            if item.get("truncated_cells"):
                raise DataError(f"the hub's viewer truncated GSM8K {split} row {index} ({url})", hint=_DATA_HINT)
            rows.append({"question": row["question"], "answer": row["answer"]})
        if len(rows) > expected:
            raise DataError(f"the hub's GSM8K {split} split sent {len(rows)} rows, expected {expected} ({url})")
        if on_page is not None:
            on_page(len(page))
    return rows


def _write_atomically(path: Path, split: str, rows: list[dict[str, str]], check: Callable[[Path], Any] | None) -> None:
    from sparkit.paths import ensure_dir, open_output

    ensure_dir(path.parent)
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    try:
        with open_output(part, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")
        if check is not None:
            try:
                check(part)
            except DataError as exc:
                raise DataError(f"the downloaded GSM8K {split} split is not usable: {exc.message}", hint=exc.hint) from exc
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


def download_gsm8k(
    destinations: dict[str, Path],
    *,
    base_url: str | None = None,
    timeout: float = 30.0,
    retries: int = 2,
    backoff_s: float = 0.5,
    on_progress: DownloadProgressFn | None = None,
    check: Callable[[Path], Any] | None = None,
) -> dict[str, Path]:
    """Download each split of {split: path} whose file is missing; existing files are reused
    untouched (no request). `check(part_file)` may raise DataError to refuse a file before it
    replaces anything in the cache."""
    missing = {split: Path(path) for split, path in destinations.items() if not Path(path).is_file()}
    if not missing:
        return dict(destinations)
    base_url = base_url or rows_url()
    if hub_offline():
        raise DataError(
            f"GSM8K is not in the cache ({next(iter(missing.values())).parent}) and HF_HUB_OFFLINE is set, "
            f"so it is not downloaded from {dataset_page_url()}",
            hint="leave out --from-hub (sparkit ships the same files), pass --data /path/to/gsm8k/test.jsonl "
                 "(train.jsonl beside it), or unset HF_HUB_OFFLINE",
        )
    import httpx

    total = sum(SPLIT_SIZES[split] for split in missing)
    done = 0
    with httpx.Client(timeout=timeout, follow_redirects=True, headers={"Accept": "application/json"}) as client:
        for split, path in missing.items():
            def on_page(count: int, split: str = split) -> None:
                nonlocal done
                done += count
                if on_progress is not None:
                    on_progress(DownloadProgress(split=split, done=done, total=total))

            rows = fetch_split(split, client=client, base_url=base_url, on_page=on_page, retries=retries, backoff_s=backoff_s)
            _write_atomically(path, split, rows, check)
    return dict(destinations)
