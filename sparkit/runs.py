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

Lifecycle: `launch(plan)` builds the embedded models, starts the engine in its own
process group (log in the run dir), follows its startup phase and waits for /health,
and on any failure stops the group and raises LaunchError with a diagnosis;
`stop(run)` sends SIGTERM to the group and SIGKILL after a grace period;
`run_status`, `mark_stale`, `follow_log` serve `sparkit status | down | logs`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sparkit.engines.base import get_adapter
from sparkit.errors import EngineError, LaunchError, UsageError
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
    return sorted(runs, key=_start_order)


def _start_order(run: RunDir) -> tuple[str, float]:
    # By start time, not meta.json's mtime: stopping a run rewrites its meta, and the run
    # stopped last must not become "the latest run".
    try:
        started = run.read_meta().started_at or ""
    except Exception:  # a torn meta.json still lists, ordered by its file time
        started = ""
    return (started, run.meta_path.stat().st_mtime)


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
        live = [r for r in runs if is_live(r)]
        if not live:
            # Exit 7 like a --url where nothing answers: in both cases there is no server to talk to.
            raise EngineError("no running server found", hint="start one with `sparkit up`, or pass --url URL")
        return live[-1]
    exact = [r for r in runs if r.id == ref]
    if exact:
        return exact[0]
    matches = [
        r for r in runs
        if r.id.startswith(ref) or ref in (r.read_meta().recipe_name, r.read_meta().recipe_name.rsplit("/", 1)[-1])
    ]
    if not matches:
        raise UsageError(f"no run matches {ref!r}", hint="`sparkit status` lists the runs")
    return matches[-1]


@dataclass
class ServerTarget:
    url: str
    api_key: str | None = None
    run: RunDir | None = None


def resolve_server(run: str | None = None, url: str | None = None, api_key: str | None = None) -> ServerTarget:
    """Where to send requests: --url wins, else a run (latest live by default). A --url that is a
    live run's own URL is that run (its recipe, its startup checks, its key)."""
    if url:
        url = url.rstrip("/")
        same = [r for r in live_runs() if _meta_url(r) == url]
        if not same:
            return ServerTarget(url=url, api_key=api_key)
        meta = same[-1].read_meta()
        key = api_key or (os.environ.get(meta.api_key_env) if meta.api_key_env else None)
        return ServerTarget(url=url, api_key=key, run=same[-1])
    found = find_run(run)
    meta = found.read_meta()
    key = api_key or (os.environ.get(meta.api_key_env) if meta.api_key_env else None)
    return ServerTarget(url=meta.url, api_key=key, run=found)


# -- process lifecycle -------------------------------------------------------------------------
# Why a process group per server: SGLang forks schedulers and detokenizers; one
# killpg reaches all of them, and Ctrl-C in the terminal does not hit the engine
# before sparkit has had a chance to stop it cleanly.

# Engines we started in this process, by pid, so that stop() can reap them (no zombies).
_children: dict[int, subprocess.Popen] = {}


@dataclass
class LaunchProgress:
    """One progress event of `launch` (for a live phase line)."""

    phase: str  # "building model", "starting", "loading weights", "capturing CUDA graphs", "warming up", "ready"
    elapsed_s: float
    message: str = ""
    fraction: float | None = None  # known only while building a model


ProgressFn = Callable[[LaunchProgress], None]


def new_run_id(recipe_name: str) -> str:
    import secrets

    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in recipe_name) or "run"
    return f"{safe}-{stamp}-{secrets.token_hex(2)}"


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (for --port auto)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host if host not in ("0.0.0.0", "") else "127.0.0.1", 0))
        return sock.getsockname()[1]


def _secret_delivery(plan: Any, adapter: Any, run: RunDir) -> tuple[dict[str, str], list[str]]:
    """How the API key reaches the engine without appearing in argv or plan.json (the engine's
    adapter knows: an environment variable, or a private file)."""
    if not plan.api_key_env:
        return {}, []
    secret = os.environ.get(plan.api_key_env)
    if not secret:
        raise LaunchError(
            f"the recipe asks for an API key from ${plan.api_key_env}, which is not set",
            hint=f"export {plan.api_key_env}=... before `sparkit up`",
        )
    return adapter.deliver_secret(secret, run.path)


def _tail(path: Path, n: int = 25) -> list[str]:
    from sparkit.engines.sglang.log import tail_lines

    try:
        return tail_lines(path.read_text(errors="replace"), n)
    except OSError:
        return []


def _launch_failure(run: RunDir, summary: str, returncode: int | None) -> LaunchError:
    text = run.log_path.read_text(errors="replace") if run.log_path.exists() else ""
    diagnosis = get_adapter(run.read_meta().engine).diagnose(text, returncode)
    last = _tail(run.log_path)
    meta = run.read_meta()
    meta.extra.update({"state": "failed", "failure": diagnosis.cause, "stopped_at": _now()})
    run.write_meta(meta)
    lines = "\n".join(f"    {line}" for line in last) or "    (the log is empty)"
    message = (
        f"{summary} ({diagnosis.cause}): {diagnosis.detail}\n"
        f"  last log lines ({run.log_path}):\n{lines}"
    )
    error = LaunchError(message, hint=diagnosis.hint)
    error.run = run  # type: ignore[attr-defined]
    error.diagnosis = diagnosis  # type: ignore[attr-defined]
    return error


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def launch(
    plan: Any,
    *,
    on_progress: ProgressFn | None = None,
    timeout: float = 600,
    detach: bool = True,
) -> RunDir:
    """Start the engine of `plan` in its own process group and wait until /health answers.

    Preflight is the caller's job. Builds the embedded models first. The engine's
    stdout+stderr go to <run dir>/server.log; its environment is os.environ + plan.env
    + SPARKIT_REPORT_DIR=<run dir>. On any failure (exit, timeout, Ctrl-C) the process
    group is stopped before the error propagates, so nothing is left running; a
    LaunchError carries the last log lines and a diagnosis.
    """
    from sparkit.engines.activation import REPORT_DIR_ENV

    t0 = time.monotonic()
    last_phase = [""]

    def emit(phase: str, message: str = "", fraction: float | None = None) -> None:
        last_phase[0] = phase
        if on_progress is not None:
            on_progress(LaunchProgress(phase, time.monotonic() - t0, message, fraction))

    run = RunDir(runs_dir() / new_run_id(plan.recipe_name))
    run.path.mkdir(parents=True, exist_ok=False)
    run.write_json("plan.json", plan.to_dict())
    meta = RunMeta(
        id=run.id,
        recipe_name=plan.recipe_name,
        recipe_path=plan.recipe_path,
        engine=plan.engine,
        url=plan.url,
        host=plan.host,
        port=plan.port,
        started_at=_now(),
        api_key_env=plan.api_key_env,
        detached=detach,
        extra={"state": "starting"},
    )
    run.write_meta(meta)

    adapter = get_adapter(plan.engine)
    adapter.prepare(plan, lambda fraction, message: emit("building model", message, fraction))
    secret_env, extra_argv = _secret_delivery(plan, adapter, run)
    env = {**os.environ, **plan.env, REPORT_DIR_ENV: str(run.path), **secret_env}
    env.setdefault("PYTHONUNBUFFERED", "1")  # the phase line reads the log as it is written
    argv = list(plan.argv) + extra_argv
    emit("starting", " ".join(argv[1:4])[:100])
    with open(run.log_path, "ab") as log:
        try:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            meta.extra.update({"state": "failed", "failure": "engine not installed"})
            run.write_meta(meta)
            raise LaunchError(
                f"engine not installed: cannot execute {argv[0]!r} ({exc.strerror})",
                hint="install the engine (`pip install sglang==0.5.23`, or `pip install sparkit[embedded]`)",
            ) from exc
    _children[proc.pid] = proc
    meta.pid = proc.pid
    meta.pgid = proc.pid  # start_new_session: the child leads its own group
    meta.extra["create_time"] = _create_time(proc.pid)
    run.write_meta(meta)

    try:
        _wait_healthy(run, proc, plan, timeout, emit, t0)
    except BaseException:  # exit, timeout, Ctrl-C or anything unexpected: leave nothing behind
        stop(run, grace=5)
        raise
    finally:
        # SGLang read its --config file at start; the key need not stay on disk.
        for name in adapter.secret_files:
            (run.path / name).unlink(missing_ok=True)
    meta = run.read_meta()
    meta.extra["state"] = "running"
    meta.extra["ready_s"] = round(time.monotonic() - t0, 2)
    run.write_meta(meta)
    emit("ready")
    return run


def _create_time(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:
        return None


def _wait_healthy(run: RunDir, proc: subprocess.Popen, plan: Any, timeout: float, emit: Callable[..., None], t0: float) -> None:
    import httpx

    from sparkit.engines.base import STARTUP_PHASES as PHASES

    adapter = get_adapter(plan.engine)
    deadline = t0 + timeout
    key = os.environ.get(plan.api_key_env) if plan.api_key_env else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    state = {"phase": 0, "last_emit": 0.0, "last_line": "", "pending": ""}  # pending: a partial last line

    def read_phases(log) -> None:
        # Read only what was appended: SGLang logs can grow large while it starts.
        chunk = state["pending"] + log.read()
        complete, _, state["pending"] = chunk.rpartition("\n")
        now = time.monotonic()
        for line in complete.splitlines():
            if not line.strip():
                continue
            state["last_line"] = line.strip()[:100]
            # "ready" is reported once /health answers; the log line alone ends warm-up.
            index = min(PHASES.index(adapter.startup_phase(line)), PHASES.index("warming up"))
            if index > state["phase"]:  # every phase crossed is shown, in order
                state["phase"] = index
                emit(PHASES[index], state["last_line"])
                state["last_emit"] = now

    with open(run.log_path, "r", errors="replace") as log, httpx.Client(
        base_url=plan.url, headers=headers, timeout=httpx.Timeout(3.0, connect=1.0)
    ) as http:
        while True:
            code = proc.poll()
            if code is not None:
                raise _launch_failure(run, "the engine exited during start", code)
            read_phases(log)
            now = time.monotonic()
            if now - state["last_emit"] >= 1.0:
                emit(PHASES[state["phase"]], state["last_line"])
                state["last_emit"] = now
            try:
                if http.get("/health").status_code == 200:
                    # What the engine logged between the read above and its first 200 is shown too
                    # (under load a whole start can fit in that gap).
                    read_phases(log)
                    return
            except httpx.HTTPError:
                pass
            if now >= deadline:
                raise _launch_failure(run, f"the engine did not become healthy within {timeout:g} s", None)
            time.sleep(0.25)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Only zombies left (children we have not reaped yet) do not count.
    try:
        import psutil

        for proc in psutil.process_iter(["pid", "status"]):
            try:
                if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    return True
            except (ProcessLookupError, psutil.Error, OSError):
                continue
        return False
    except ImportError:  # pragma: no cover - psutil is a dependency
        return True


def _reap(pid: int | None) -> None:
    proc = _children.get(pid) if pid else None
    if proc is not None and proc.poll() is not None:
        _children.pop(pid, None)


def stop(run: RunDir, grace: float = 10) -> None:
    """SIGTERM to the run's process group, SIGKILL after `grace` seconds; waits until it is gone."""
    meta = run.read_meta()
    pgid = meta.pgid or meta.pid
    if pgid and _is_our_process(meta):
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            end = time.monotonic() + wait
            while time.monotonic() < end:
                _reap(meta.pid)
                if not _group_alive(pgid):
                    break
                time.sleep(0.1)
            _reap(meta.pid)
            if not _group_alive(pgid):
                break
    _reap(meta.pid)
    meta = run.read_meta()
    if meta.extra.get("state") not in ("failed",):
        meta.extra["state"] = "stopped"
    meta.extra.setdefault("stopped_at", _now())
    run.write_meta(meta)


def _is_our_process(meta: RunMeta) -> bool:
    """The recorded pid still belongs to the engine we started (pids get reused)."""
    if not meta.pid:
        return False
    if meta.pid in _children:
        return True
    if not pid_alive(meta.pid):
        # The leader is gone; its group may still hold children (SGLang schedulers).
        try:
            os.killpg(meta.pgid or meta.pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    created = meta.extra.get("create_time")
    actual = _create_time(meta.pid)
    return created is None or actual is None or abs(actual - created) < 1.0


def is_live(run: RunDir) -> bool:
    try:
        meta = run.read_meta()
    except (OSError, ValueError, TypeError):
        return False
    return pid_alive(meta.pid) and _is_our_process(meta)


@dataclass
class RunStatus:
    """What `sparkit status` shows for one run."""

    id: str
    recipe: str
    engine: str
    url: str
    pid: int | None
    state: str  # running | starting | stopped | failed | exited (stale: died without `down`)
    uptime_s: float | None
    healthy: bool | None
    decode_tok_s: float | None
    accept_length: float | None
    checks: str | None  # worst status of the last checks
    log: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_status(run: RunDir, *, probe_health: bool = True) -> RunStatus:
    meta = run.read_meta()
    live = is_live(run)
    state = meta.extra.get("state", "running")
    if not live and state in ("running", "starting"):
        state = "exited"
    uptime = None
    if live and meta.started_at:
        try:
            uptime = (datetime.now(timezone.utc) - datetime.fromisoformat(meta.started_at)).total_seconds()
        except ValueError:
            uptime = None
    healthy: bool | None = None
    if live and probe_health:
        healthy = _health(meta)
    probe = run.read_json("probe.json") or {}
    checks = run.read_json("checks.json") or {}
    worst_status = None
    if checks.get("results"):
        from sparkit.checks.results import CheckResult, worst

        worst_status = worst([CheckResult.from_dict(r) for r in checks["results"]]).value
    return RunStatus(
        id=run.id,
        recipe=meta.recipe_name,
        engine=meta.engine,
        url=meta.url,
        pid=meta.pid,
        state=state,
        uptime_s=uptime,
        healthy=healthy,
        decode_tok_s=probe.get("decode_tok_s"),
        accept_length=probe.get("accept_length"),
        checks=worst_status,
        log=str(run.log_path),
    )


def _health(meta: RunMeta) -> bool:
    import httpx

    key = os.environ.get(meta.api_key_env) if meta.api_key_env else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        return httpx.get(meta.url + "/health", headers=headers, timeout=3.0).status_code == 200
    except httpx.HTTPError:
        return False


def mark_stale() -> list[RunDir]:
    """Runs recorded as running whose process died without `down`: marked 'exited'."""
    stale = []
    for run in list_runs():
        try:
            meta = run.read_meta()
        except (OSError, ValueError, TypeError):
            continue
        if meta.extra.get("state", "running") in ("running", "starting") and not is_live(run):
            meta.extra["state"] = "exited"
            meta.extra.setdefault("stopped_at", _now())
            run.write_meta(meta)
            stale.append(run)
    return stale


def prune_runs() -> list[str]:
    """Delete the directories of runs that are no longer live; returns their ids."""
    import shutil

    removed = []
    for run in list_runs():
        if not is_live(run):
            shutil.rmtree(run.path, ignore_errors=True)
            removed.append(run.id)
    return removed


def _meta_url(run: RunDir) -> str | None:
    try:
        return run.read_meta().url.rstrip("/")
    except (OSError, ValueError, TypeError):
        return None


def live_runs() -> list[RunDir]:
    return [r for r in list_runs() if is_live(r)]


def follow_log(run: RunDir, *, from_start: bool = False, poll: float = 0.2, stop_when: Callable[[], bool] | None = None):
    """Yield lines of the run's log as they are written (like tail -f).

    Ends when `stop_when()` is true or the engine is gone and the log is drained."""
    path = run.log_path
    with open(path, "r", errors="replace") as handle:
        if not from_start:
            handle.seek(0, os.SEEK_END)
        buffer = ""
        while True:
            chunk = handle.read()
            if chunk:
                buffer += chunk
                *lines, buffer = buffer.split("\n")
                yield from lines
                continue
            if stop_when is not None and stop_when():
                return
            if not is_live(run):
                if buffer:
                    yield buffer
                return
            time.sleep(poll)
