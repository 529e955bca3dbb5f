"""Run directories and process lifecycle.

A Run is a started server. Each has a directory under sparkit.paths.runs_dir():

    <runs_dir>/<run_id>/
        meta.json              RunMeta: id, recipe, engine, url, pid, pgid, started_at, ...
        plan.json              the LaunchPlan it was started from
        server.log             the engine's stdout+stderr
        activation-tp*.json    activation reports written from inside the engine
        checks.json            the last startup-check results
        probe.json             the last measured decode tok/s and accept length

Other commands (chat, eval, bench, check) find a server with `resolve_server`:
an explicit --url wins, else a run id / recipe name, else the latest live run.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkit.errors import UsageError
from sparkit.paths import runs_dir


@dataclass
class RunMeta:
    id: str
    recipe_name: str
    recipe_path: str | None
    engine: str
    url: str
    host: str
    port: int
    pid: int | None = None
    pgid: int | None = None
    started_at: str = ""
    api_key_env: str | None = None
    detached: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class RunDir:
    """A run directory on disk. Knows its files; never prints."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def meta_path(self) -> Path:
        return self.path / "meta.json"

    @property
    def plan_path(self) -> Path:
        return self.path / "plan.json"

    @property
    def log_path(self) -> Path:
        return self.path / "server.log"

    @property
    def checks_path(self) -> Path:
        return self.path / "checks.json"

    @property
    def probe_path(self) -> Path:
        return self.path / "probe.json"

    def read_meta(self) -> RunMeta:
        return RunMeta(**json.loads(self.meta_path.read_text()))

    def write_meta(self, meta: RunMeta) -> None:
        self._write_json(self.meta_path, asdict(meta))

    def read_json(self, name: str) -> Any | None:
        path = self.path / name
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def _write_json(self, path: Path, data: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, default=str))
        os.replace(tmp, path)

    def write_json(self, name: str, data: Any) -> None:
        self._write_json(self.path / name, data)


def list_runs() -> list[RunDir]:
    """All run directories, oldest first."""
    root = runs_dir()
    if not root.is_dir():
        return []
    runs = [RunDir(p) for p in root.iterdir() if (p / "meta.json").exists()]
    return sorted(runs, key=lambda r: r.meta_path.stat().st_mtime)


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        import psutil

        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False


def find_run(ref: str | None) -> RunDir:
    """A run by id, id prefix or recipe name; None means the latest live run."""
    runs = list_runs()
    if ref is None:
        live = [r for r in runs if pid_alive(r.read_meta().pid)]
        if not live:
            raise UsageError("no running server found", hint="start one with `sparkit up`, or pass --url")
        return live[-1]
    exact = [r for r in runs if r.id == ref]
    if exact:
        return exact[0]
    matches = [r for r in runs if r.id.startswith(ref) or r.read_meta().recipe_name == ref]
    if not matches:
        raise UsageError(f"no run matches {ref!r}", hint="`sparkit status` lists the runs")
    return matches[-1]


@dataclass
class ServerTarget:
    url: str
    api_key: str | None = None
    run: RunDir | None = None


def resolve_server(run: str | None = None, url: str | None = None, api_key: str | None = None) -> ServerTarget:
    """Where to send requests: --url wins, else a run (latest live by default)."""
    if url:
        return ServerTarget(url=url.rstrip("/"), api_key=api_key)
    found = find_run(run)
    meta = found.read_meta()
    key = api_key or (os.environ.get(meta.api_key_env) if meta.api_key_env else None)
    return ServerTarget(url=meta.url, api_key=key, run=found)
