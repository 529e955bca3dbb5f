"""GSM8K from the Hugging Face hub's dataset viewer: a real local HTTP server on 127.0.0.1 speaks
the viewer's /rows JSON (built from the GSM8K files shipped with sparkit: the hub's rows are the
same), pointed to by SPARKIT_GSM8K_ROWS_URL."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from _shared import GSM8K_DIR

from sparkit.errors import DataError
from sparkit.evals import hub
from sparkit.evals.gsm8k.data import SHIPPED_DIR, ensure_downloaded, load_dataset

SPLITS = {split: [json.loads(line) for line in (GSM8K_DIR / f"{split}.jsonl").read_text().splitlines()] for split in ("test", "train")}


class Viewer:
    """The dataset viewer's /rows endpoint, with knobs for the failures a user can meet."""

    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []
        self.fail_next: list[int] = []  # HTTP statuses answered before serving normally
        self.retry_after: str | None = None  # sent with those statuses
        self.drop_next = 0  # connections closed without an answer before serving normally
        self.html = False  # a captive portal: 200 with a web page
        self.total_override: int | None = None
        self.max_length = 100
        handler = self._handler()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/rows"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        viewer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                viewer.requests.append(query)
                if viewer.drop_next:
                    viewer.drop_next -= 1
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if viewer.fail_next:
                    headers = {"Retry-After": viewer.retry_after} if viewer.retry_after else {}
                    self._send(viewer.fail_next.pop(0), {"error": "The server is busy."}, headers)
                    return
                if viewer.html:
                    payload = b"<html><body>Please log in to the hotel wifi</body></html>"
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if parts.path != "/rows" or query.get("dataset") != "openai/gsm8k" or query.get("config") != "main" \
                        or query.get("split") not in SPLITS:
                    self._send(404, {"error": "Not found."})
                    return
                offset, length = int(query["offset"]), int(query["length"])
                if length > viewer.max_length:
                    self._send(422, {"error": "Parameter 'length' must not be greater than 100"})
                    return
                data = SPLITS[query["split"]]
                rows = [{"row_idx": i, "row": data[i], "truncated_cells": []} for i in range(offset, min(offset + length, len(data)))]
                self._send(200, {
                    "features": [{"feature_idx": 0, "name": "question", "type": {"dtype": "string", "_type": "Value"}},
                                 {"feature_idx": 1, "name": "answer", "type": {"dtype": "string", "_type": "Value"}}],
                    "rows": rows,
                    "num_rows_total": viewer.total_override if viewer.total_override is not None else len(data),
                    "num_rows_per_page": 100,
                    "partial": False,
                })

            def _send(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
                payload = json.dumps(body).encode()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler

    def pages(self, split: str) -> list[int]:
        return [int(q["offset"]) for q in self.requests if q.get("split") == split]


@pytest.fixture
def viewer(monkeypatch) -> Iterator[Viewer]:
    server = Viewer()
    server.thread.start()
    monkeypatch.setenv(hub.ROWS_URL_ENV, server.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cache(sparkit_home):
    return sparkit_home / "cache" / "gsm8k"


def test_both_splits_are_downloaded_page_by_page_into_the_cache(sparkit_home, viewer):
    seen: list[hub.DownloadProgress] = []
    test_path, train_path = ensure_downloaded(on_progress=seen.append)

    assert (test_path.parent, train_path.parent) == (cache(sparkit_home), cache(sparkit_home))
    # Byte for byte the original release's files, so results (whose settings hash includes the
    # test file's sha256) compare with runs made with --data on that release.
    assert test_path.read_bytes() == (GSM8K_DIR / "test.jsonl").read_bytes()
    assert train_path.read_bytes() == (GSM8K_DIR / "train.jsonl").read_bytes()
    assert viewer.pages("test") == list(range(0, 1319, 100))  # 14 pages of at most 100 rows
    assert viewer.pages("train") == list(range(0, 7473, 100))
    assert all(q["length"] == "100" for q in viewer.requests)
    assert seen[-1] == hub.DownloadProgress(split="train", done=1319 + 7473, total=1319 + 7473)
    assert [p.done for p in seen] == sorted(p.done for p in seen)
    assert not list(cache(sparkit_home).glob("*.part"))

    dataset = load_dataset(None, from_hub=True)
    assert (len(dataset.test), len(dataset.train)) == (1319, 7473)
    assert dataset.sha256 == load_dataset(GSM8K_DIR / "test.jsonl").sha256


def test_the_cache_is_reused_without_a_request(sparkit_home, viewer):
    ensure_downloaded()
    before = len(viewer.requests)
    load_dataset(None, from_hub=True)
    assert len(viewer.requests) == before


def test_only_the_missing_split_is_downloaded(sparkit_home, viewer):
    ensure_downloaded()
    (cache(sparkit_home) / "test.jsonl").unlink()
    viewer.requests.clear()
    ensure_downloaded()
    assert viewer.pages("train") == [] and len(viewer.pages("test")) == 14


def test_a_transient_503_is_retried(sparkit_home, viewer):
    viewer.fail_next = [503, 503]
    test_path, _ = hub_download(sparkit_home)
    assert len(test_path.read_text().splitlines()) == 1319
    assert viewer.requests[0]["offset"] == viewer.requests[1]["offset"] == viewer.requests[2]["offset"] == "0"


def test_a_dropped_connection_is_retried(sparkit_home, viewer):
    viewer.drop_next = 1
    test_path, _ = hub_download(sparkit_home)
    assert test_path.read_bytes() == (GSM8K_DIR / "test.jsonl").read_bytes()
    assert viewer.pages("test")[:2] == [0, 0]


def test_a_rate_limit_waits_as_long_as_the_hub_asks(sparkit_home, viewer, monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(hub.time, "sleep", waits.append)  # record the wait instead of sleeping it
    viewer.fail_next, viewer.retry_after = [429], "3"
    hub_download(sparkit_home)
    assert waits == [3.0]


def test_a_web_page_instead_of_json_is_a_data_error(sparkit_home, viewer):
    viewer.html = True
    with pytest.raises(DataError, match="did not answer JSON"):
        hub_download(sparkit_home)
    assert not list(cache(sparkit_home).glob("*"))


def test_a_503_that_persists_is_a_data_error_after_the_retries(sparkit_home, viewer):
    viewer.fail_next = [503, 503, 503]
    with pytest.raises(DataError) as info:
        hub_download(sparkit_home)
    assert "HTTP 503 (after 3 attempts)" in info.value.message and viewer.url in info.value.message
    assert info.value.exit_code == 8 and "--data" in info.value.hint
    assert not list(cache(sparkit_home).glob("*"))


def test_a_client_error_is_not_retried(sparkit_home, viewer):
    viewer.max_length = 50  # the viewer refuses our page size: retrying cannot help
    with pytest.raises(DataError, match="HTTP 422"):
        hub_download(sparkit_home)
    assert len(viewer.requests) == 1


def test_a_wrong_row_count_is_a_data_error_and_nothing_is_cached(sparkit_home, viewer):
    viewer.total_override = 1320
    with pytest.raises(DataError) as info:
        ensure_downloaded()
    assert "test split has 1320 rows, expected 1319" in info.value.message
    assert not list(cache(sparkit_home).glob("*"))


def test_a_file_the_check_refuses_never_replaces_the_cache(sparkit_home, viewer):
    def refuse(path):
        raise DataError(f"{path}:1: answer has no '#### N' final line")

    with pytest.raises(DataError, match="downloaded GSM8K test split is not usable"):
        hub.download_gsm8k({"test": cache(sparkit_home) / "test.jsonl"}, check=refuse)
    assert not list(cache(sparkit_home).glob("*"))


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_hf_hub_offline_refuses_without_any_request(sparkit_home, viewer, monkeypatch, value):
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    with pytest.raises(DataError) as info:
        load_dataset(None, from_hub=True)
    assert "HF_HUB_OFFLINE" in info.value.message and "--data" in info.value.hint
    assert viewer.requests == []


def test_hf_hub_offline_still_uses_the_cache(sparkit_home, viewer, monkeypatch):
    ensure_downloaded()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert len(load_dataset(None, from_hub=True).test) == 1319


def test_the_offline_message_names_the_hf_endpoint_mirror(sparkit_home, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "https://hf-mirror.example/")
    with pytest.raises(DataError, match="https://hf-mirror.example/datasets/openai/gsm8k"):
        ensure_downloaded()


def test_connection_refused_is_a_data_error_naming_the_url(sparkit_home, monkeypatch):
    url = f"http://127.0.0.1:{_closed_port()}/rows"
    monkeypatch.setenv(hub.ROWS_URL_ENV, url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(DataError) as info:
        load_dataset(None, from_hub=True)
    assert url in info.value.message and "split=test" in info.value.message
    assert info.value.exit_code == 8 and "--data" in info.value.hint
    assert not list(cache(sparkit_home).glob("*"))


def test_the_default_is_the_hubs_viewer(monkeypatch):
    monkeypatch.delenv(hub.ROWS_URL_ENV, raising=False)
    assert hub.rows_url() == "https://datasets-server.huggingface.co/rows"
    assert hub.page_url(hub.rows_url(), "test", 200) == (
        "https://datasets-server.huggingface.co/rows?dataset=openai%2Fgsm8k&config=main&split=test&offset=200&length=100")


def hub_download(sparkit_home):
    # Short backoff: the retry behaviour is what is tested, not the wait.
    paths = hub.download_gsm8k({"test": cache(sparkit_home) / "test.jsonl"}, backoff_s=0.01)
    return paths["test"], None


def test_cli_downloads_then_fails_at_the_unreachable_engine(tmp_path, viewer):
    home = tmp_path / "home"
    env = {**os.environ, "SPARKIT_HOME": str(home), hub.ROWS_URL_ENV: viewer.url}
    env.pop("HF_HUB_OFFLINE", None)
    engine = f"http://127.0.0.1:{_closed_port()}"
    done = subprocess.run([sys.executable, "-m", "sparkit", "eval", "gsm8k", "--url", engine, "--limit", "1", "--from-hub",
                           "--out", str(tmp_path / "r.jsonl")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 7, done.stderr  # the data came down; the engine is what failed
    assert engine.removeprefix("http://") in done.stderr and "Traceback" not in done.stderr
    assert len((home / "cache" / "gsm8k" / "test.jsonl").read_text().splitlines()) == 1319
    assert len((home / "cache" / "gsm8k" / "train.jsonl").read_text().splitlines()) == 7473
    assert "GSM8K from the hub" in done.stderr


def test_without_data_the_shipped_copy_is_read_offline_without_any_request(sparkit_home, viewer, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    dataset = load_dataset(None)
    assert (len(dataset.test), len(dataset.train)) == (1319, 7473)
    assert dataset.test_path == SHIPPED_DIR / "test.jsonl" and "shipped" in dataset.source
    assert viewer.requests == [] and not cache(sparkit_home).exists()


def test_the_shipped_copy_is_the_hubs_bytes_so_results_hash_alike(sparkit_home, viewer):
    # A results file made on the shipped copy resumes with --from-hub and compares with it: the
    # settings hash includes the test file's sha256.
    assert load_dataset(None, from_hub=True).sha256 == load_dataset(None).sha256
    assert "MIT" in (SHIPPED_DIR / "LICENSE").read_text()
    notice = (SHIPPED_DIR / "NOTICE.txt").read_text()
    for split in ("test", "train"):
        assert hashlib.sha256((SHIPPED_DIR / f"{split}.jsonl").read_bytes()).hexdigest() in notice


def test_data_and_from_hub_together_is_a_usage_error():
    from sparkit.errors import UsageError

    with pytest.raises(UsageError, match="--data and --from-hub"):
        load_dataset(GSM8K_DIR, from_hub=True)


def test_the_package_data_globs_ship_every_gsm8k_file():
    import fnmatch
    import tomllib

    from _shared import REPO_DIR

    patterns = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["sparkit.evals"]
    package = REPO_DIR / "sparkit" / "evals"
    files = [p.relative_to(package).as_posix() for p in SHIPPED_DIR.iterdir()]
    assert sorted(files) == ["data/gsm8k/LICENSE", "data/gsm8k/NOTICE.txt", "data/gsm8k/test.jsonl", "data/gsm8k/train.jsonl"]
    assert all(any(fnmatch.fnmatch(f, pattern) for pattern in patterns) for f in files)


def test_cli_without_data_uses_the_shipped_copy_offline(tmp_path, viewer):
    home = tmp_path / "home"
    env = {**os.environ, "SPARKIT_HOME": str(home), hub.ROWS_URL_ENV: viewer.url, "HF_HUB_OFFLINE": "1"}
    engine = f"http://127.0.0.1:{_closed_port()}"
    done = subprocess.run([sys.executable, "-m", "sparkit", "eval", "gsm8k", "--url", engine, "--limit", "1",
                           "--out", str(tmp_path / "r.jsonl")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 7, done.stderr  # the data was there; only the engine is missing
    assert "shipped with sparkit" in done.stderr and viewer.requests == []
    assert not (home / "cache" / "gsm8k").exists()
