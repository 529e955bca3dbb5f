"""Run directories and process lifecycle.

A Run is a started server. Each has a directory under sparkit.paths.runs_dir():

    <runs_dir>/<run_id>/
        meta.json              RunMeta: id, recipe, engine, url, pid, pgid, started_at, ...
        plan.json              the LaunchPlan it was started from
        server.log             the engine's stdout+stderr
        activation-tp*.json    activation reports written from inside the engine
        checks.json            the last startup-check results
        probe.json             the last measured decode tok/s and accept length
        memory-guard.jsonl     the load guard's decisions while the engine started

Other commands (chat, eval, bench, check) find a server with `resolve_server`:
an explicit --url wins, else a run id / recipe name, else the latest live run.

Lifecycle: `launch(plan)` builds the embedded models, starts the engine in its own
process group (log in the run dir), follows its startup phase and waits for /health
while the load guard (sparkit.memory.guard) watches memory, and on any failure stops the
group and raises LaunchError with a diagnosis;
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

API_KEY_ENV_EMBEDDED = "SPARKIT_API_KEY"
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


def _secret_env(plan: Any, run: RunDir) -> tuple[dict[str, str], list[str]]:
    """How the API key reaches the engine without appearing in argv or plan.json.

    The embedded engine reads SPARKIT_API_KEY. SGLang has no env var for it, so it
    gets a 0600 YAML file passed with --config (SGLang merges it into its args)."""
    if not plan.api_key_env:
        return {}, []
    secret = os.environ.get(plan.api_key_env)
    if not secret:
        raise LaunchError(
            f"the recipe asks for an API key from ${plan.api_key_env}, which is not set",
            hint=f"export {plan.api_key_env}=... before `sparkit up`",
        )
    if plan.engine == "embedded":
        return {API_KEY_ENV_EMBEDDED: secret}, []
    path = run.path / "secrets.yaml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"api-key: {json.dumps(secret)}\n")
    return {}, ["--config", str(path)]


def _build_models(plan: Any, emit: Callable[..., None]) -> None:
    if not plan.model_builds:
        return
    from sparkit.engines.embedded.builder import ensure_model

    for build in plan.model_builds:
        name = build.get("name", "tiny-ling")

        def report(fraction: float, message: str, _name: str = name) -> None:
            emit("building model", f"{_name}: {message}", fraction)

        directory = ensure_model(name, int(build.get("seed", 0)), build.get("dir"), progress=report, steps=build.get("steps"))
        export = build.get("export_hf")
        if export:
            from sparkit.engines.embedded.hf_checkpoint import ensure_hf_export

            emit("building model", f"{name}: writing its Hugging Face export to {export['dir']}", 1.0)
            ensure_hf_export(directory, export["dir"], export.get("dtype", "bfloat16"))


def _tail(path: Path, n: int = 25) -> list[str]:
    from sparkit.checks.evidence import tail_lines

    try:
        return tail_lines(path.read_text(errors="replace"), n)
    except OSError:
        return []


def _launch_failure(run: RunDir, summary: str, returncode: int | None) -> LaunchError:
    from sparkit.checks.evidence import diagnose_failure

    text = run.log_path.read_text(errors="replace") if run.log_path.exists() else ""
    diagnosis = diagnose_failure(text, returncode)
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

    _build_models(plan, emit)
    secret_env, extra_argv = _secret_env(plan, run)
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

    guard = _start_guard(plan, run, proc)
    try:
        _wait_healthy(run, proc, plan, timeout, emit, t0, guard, last_phase)
    except BaseException:  # exit, timeout, Ctrl-C or anything unexpected: leave nothing behind
        stop(run, grace=5)
        raise
    finally:
        # SGLang read its --config file at start; the key need not stay on disk.
        (run.path / "secrets.yaml").unlink(missing_ok=True)
        _record_guard(run, guard)
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


def _start_guard(plan: Any, run: RunDir, proc: subprocess.Popen):
    """The load guard over this engine (None when the recipe turns it off or the OS cannot run it;
    meta.json says which)."""
    from sparkit.memory.floor import floor_bytes, guard_settings
    from sparkit.memory.guard import GUARD_LOG, LoadGuard, guard_supported

    settings = guard_settings(plan.recipe)
    unsupported = guard_supported()
    if not settings.get("enabled", True) or unsupported:
        meta = run.read_meta()
        meta.extra["memory_guard"] = {"enabled": False,
                                      "reason": unsupported or "server.memory_guard.enabled is false"}
        run.write_meta(meta)
        return None
    from sparkit.memory.checkpoint import plan_checkpoint_dirs
    from sparkit.memory.meminfo import read_meminfo
    from sparkit.memory.pagecache import weight_files

    pgid = proc.pid
    return LoadGuard(
        pgid=pgid,
        files=weight_files(plan_checkpoint_dirs(plan)),
        floor_bytes=floor_bytes(plan.recipe, read_meminfo().total),
        log_path=run.path / GUARD_LOG,
        alive=lambda: proc.poll() is None or _group_alive(pgid),
    ).start()


def _record_guard(run: RunDir, guard: Any) -> None:
    if guard is None:
        return
    summary = guard.stop()
    meta = run.read_meta()
    meta.extra["memory_guard"] = {"enabled": True, **summary.to_dict()}
    run.write_meta(meta)


def _guard_failure(run: RunDir, guard: Any, phase: str) -> LaunchError:
    """The engine was stopped by the load guard: what happened, in numbers, and what to change."""
    gib = 1024**3
    s = guard.summary
    meta = run.read_meta()
    meta.extra.update({"state": "failed", "failure": "stopped by the memory guard", "stopped_at": _now()})
    run.write_meta(meta)
    evicted = (f"; it had evicted {s.evicted_bytes / gib:.2f} GiB of the checkpoint's page cache first"
               if s.evictions else "")
    message = (f"the memory guard stopped the engine while {phase or 'starting'}: available memory fell to "
               f"{(s.stopped_at_available or s.min_available) / gib:.2f} GiB, under the floor of "
               f"{s.stop_below / gib:.2f} GiB (peak use {s.peak_used / gib:.2f} GiB above what was in use at the "
               f"start, {s.start_available / gib:.2f} GiB available then){evicted}\n"
               f"  guard log: {s.log}")
    hint = ("lower server.mem_fraction_static (`sparkit plan RECIPE` shows the range that fits), a shorter "
            "model.context_length or fewer server.max_running_requests, or a smaller checkpoint; "
            "server.memory_guard.floor_gib sets the floor (server.memory_guard.enabled: false turns the guard off)")
    error = LaunchError(message, hint=hint)
    error.run = run  # type: ignore[attr-defined]
    return error


def _wait_healthy(run: RunDir, proc: subprocess.Popen, plan: Any, timeout: float, emit: Callable[..., None], t0: float,
                  guard: Any = None, last_phase: list[str] | None = None) -> None:
    import httpx

    from sparkit.checks.evidence import PHASES, detect_phase

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
            index = min(PHASES.index(detect_phase(line)), PHASES.index("warming up"))
            if index > state["phase"]:  # every phase crossed is shown, in order
                state["phase"] = index
                emit(PHASES[index], state["last_line"])
                state["last_emit"] = now

    with open(run.log_path, "r", errors="replace") as log, httpx.Client(
        base_url=plan.url, headers=headers, timeout=httpx.Timeout(3.0, connect=1.0)
    ) as http:
        while True:
            if guard is not None and guard.tripped.is_set():
                guard.stop()  # waits until the guard has stopped the engine
                raise _guard_failure(run, guard, (last_phase or [""])[0])
            code = proc.poll()
            if code is not None:
                if guard is not None and guard.tripped.is_set():
                    continue  # the guard stopped it: its message, not "exited"
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
