"""A run on disk: one record per started server, its files, and the one rule that picks a run.

    <runs_dir>/<run_id>/
        meta.json              the Run record: recipe, engine, url, pid, pgid, state, ...
        plan.json              the LaunchPlan it was started from
        server.log             the engine's stdout+stderr
        activation-tp*.json    activation reports written from inside the engine
        checks.json            the last startup-check results
        probe.json             the last measured decode tok/s and accept length
        memory-guard.jsonl     the load guard's decisions while the engine started
        memory-fit.json        the memory fit preflight computed for it (what it will hold, per GPU):
                               a later launch reserves what a starting run does not hold yet

The file names are declared here (RunFiles) and nowhere else. Never prints.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any

from sparkit import interrupts
from sparkit.api_key import client_key, recipe_key
from sparkit.client import check_health
from sparkit.contract.checks import CheckResult, worst
from sparkit.engines.activation_report import REPORT_DIR_ENV
from sparkit.engines.base import get_adapter
from sparkit.errors import EngineError, UsageError
from sparkit.paths import check_private_dir, ensure_dir, open_state, runs_dir, write_atomic
from sparkit.runs.processes import (
    ProcessIdentity,
    engine_alive,
    is_ours,
    leaders_with_env,
    port_listener,
    stop_group,
)


class RunFiles:
    """The names of a run directory's files."""

    META = "meta.json"
    PLAN = "plan.json"
    LOG = "server.log"
    CHECKS = "checks.json"
    PROBE = "probe.json"
    MEMORY = "memory-fit.json"
    LAUNCH_LOCK = ".launch.lock"  # in the runs directory: one preflight + run record at a time


CHECKING = "startup checks"
"""Run.phase while `sparkit up` runs the startup checks."""


class RunState(str, Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"  # by `sparkit down`, or by the command that started it
    FAILED = "failed"  # did not start (see Run.failure)
    EXITED = "exited"  # was running and died without being stopped

    @property
    def active(self) -> bool:
        return self in (RunState.STARTING, RunState.RUNNING)


@dataclass
class Run:
    """One started server: its record (meta.json) and its directory."""

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
    state: RunState = RunState.STARTING
    failure: str | None = None  # the diagnosed cause, when state is failed
    ready_s: float | None = None  # seconds from launch to healthy
    stopped_at: str | None = None
    create_time: float | None = None  # the engine process's start time (pids are reused)
    cmdline: list[str] | None = None  # the engine process's argv as the OS reported it at start
    memory_guard: dict[str, Any] | None = None  # the load guard's summary (sparkit.memory.guard)
    # The sparkit process that set the run up (and, for a foreground run, holds it): a run whose
    # owner lives is in use even before its engine exists (while a model builds).
    owner: dict[str, Any] | None = None  # ProcessIdentity.to_dict()
    # What the `sparkit up` that holds the run is doing after the launch ("startup checks"): a run
    # whose up ends there did not finish starting, whatever its engine does.
    phase: str | None = None
    root: Path = field(default_factory=runs_dir, repr=False)  # the runs directory it lives in

    # -- files ----------------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self.root / self.id

    @property
    def meta_path(self) -> Path:
        return self.path / RunFiles.META

    @property
    def plan_path(self) -> Path:
        return self.path / RunFiles.PLAN

    @property
    def log_path(self) -> Path:
        return self.path / RunFiles.LOG

    @property
    def checks_path(self) -> Path:
        return self.path / RunFiles.CHECKS

    @property
    def probe_path(self) -> Path:
        return self.path / RunFiles.PROBE

    def read_log(self) -> str:
        """The engine's log so far ("" before it exists); never through a link."""
        try:
            with open_state(self.log_path, "r", errors="replace") as handle:
                return handle.read()
        except FileNotFoundError:
            return ""

    def read_json(self, name: str) -> Any | None:
        """A JSON file of the run; None when it is missing or torn (a link or another user's file
        there is refused: StateError)."""
        try:
            with open_state(self.path / name) as handle:
                return json.loads(handle.read())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            return None

    def write_json(self, name: str, data: Any) -> None:
        write_json_atomic(self.path / name, data)

    # -- the record -----------------------------------------------------------------------------
    def save(self) -> None:
        record = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "root"}
        record["state"] = self.state.value
        self.write_json(RunFiles.META, record)

    def reload(self) -> Run:
        """The record as it is on disk now (another process may have stopped the run)."""
        return Run.open(self.path)

    @classmethod
    def open(cls, path: Path) -> Run:
        """The run recorded in `path` (raises OSError / ValueError for a missing or torn record,
        StateError for a directory or record another user owns or can write, or a link)."""
        path = Path(path)
        check_private_dir(path, "the run directory")
        with open_state(path / RunFiles.META) as handle:
            data = json.loads(handle.read())
        if not isinstance(data, dict):
            raise ValueError(f"{path / RunFiles.META}: not a run record")
        # Records of sparkit before 0.3 kept state and its companions in `extra`.
        extra = data.pop("extra", None) or {}
        for key in ("state", "failure", "ready_s", "stopped_at", "create_time", "memory_guard"):
            if key in extra and key not in data:
                data[key] = extra[key]
        known = {f.name for f in fields(cls)} - {"root"}
        record = {k: v for k, v in data.items() if k in known}
        record["id"] = path.name
        record["state"] = RunState(record.get("state") or RunState.RUNNING.value)
        return cls(**record, root=path.parent)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("root")
        out["state"] = self.state.value
        out["path"] = str(self.path)
        return out

    @property
    def api_key(self) -> str | None:
        """The key its server wants, read from the environment variable the recipe named."""
        return recipe_key(self.api_key_env)

    @property
    def live(self) -> bool:
        """Its engine process is running (and is still the process sparkit started)."""
        return engine_alive(self.pid, self.pgid, self.create_time, self.cmdline)

    @property
    def has_processes(self) -> bool:
        """Something of it is left to stop: its engine, or what the engine's process group left
        when its leader died (sparkit.runs.processes.is_ours)."""
        return is_ours(self.pid, self.pgid, self.create_time, self.cmdline)

    @property
    def owner_identity(self) -> ProcessIdentity | None:
        return ProcessIdentity.from_dict(self.owner)

    @property
    def owner_alive(self) -> bool:
        owner = self.owner_identity
        return owner is not None and owner.alive()

    @property
    def setting_up(self) -> bool:
        """The `sparkit up` that is starting it is still at work (building, launching, waiting)."""
        return self.state is RunState.STARTING and self.owner_alive

    @property
    def in_use(self) -> bool:
        """Not to be pruned or marked stale: its engine runs, or its start is under way."""
        return self.live or self.setting_up

    def abandoned(self) -> str | None:
        """Why an active run can no longer become or stay what its record says, when its owner
        is gone: a start whose `sparkit up` died, or a foreground run whose `sparkit up` died.
        None when nothing is wrong (or the record is too old to name an owner)."""
        owner = self.owner_identity
        if owner is None or not self.state.active or owner.alive():
            return None
        who = f"`{_command_of(owner)}` (pid {owner.pid})"
        if self.state is RunState.STARTING:
            doing = "preparing the launch (building the model)" if self.pid is None else "waiting for the engine to start"
            return f"{who} ended while {doing}"
        if self.phase == CHECKING:
            return f"{who} ended while running the startup checks"
        if not self.detached:
            return f"{who}, which held this foreground run, ended"
        return None

    def unfinished_start(self) -> str | None:
        """Why the start of this run never finished, when its `sparkit up` ended before (during
        the launch, or during the startup checks that follow it); None otherwise."""
        if self.state is RunState.STARTING or self.phase == CHECKING:
            return self.abandoned()
        return None

    def observed_state(self) -> RunState:
        """The recorded state, corrected by what is true now: an active run whose process is
        gone has exited, a start whose `sparkit up` is gone has failed, and a run being set up is
        starting."""
        if not self.state.active:
            return self.state
        if self.setting_up or (self.phase == CHECKING and self.owner_alive and self.live):
            return RunState.STARTING
        if self.unfinished_start():
            return RunState.FAILED
        if not self.live:
            return RunState.EXITED
        if self.abandoned():  # a foreground engine that outlived its `sparkit up`
            return RunState.EXITED
        return self.state

    def status(self, *, probe_health: bool = True) -> dict[str, Any]:
        """What `sparkit status` shows: the record, whether it is up, its last figures."""
        live = self.live
        state = self.observed_state()
        uptime = None
        if live and self.started_at:
            try:
                uptime = (datetime.now(UTC) - datetime.fromisoformat(self.started_at)).total_seconds()
            except ValueError:
                uptime = None
        probe = self.read_json(RunFiles.PROBE) or {}
        checks = self.read_json(RunFiles.CHECKS) or {}
        worst_status = None
        if checks.get("results"):
            worst_status = worst([CheckResult.from_dict(r) for r in checks["results"]]).value
        return {
            "id": self.id, "recipe": self.recipe_name, "engine": self.engine, "url": self.url, "pid": self.pid,
            "state": state.value, "failure": self.failure, "uptime_s": uptime,
            "healthy": check_health(self.url, api_key=self.api_key) if live and probe_health else None,
            "decode_tok_s": probe.get("decode_tok_s"), "accept_length": probe.get("accept_length"),
            # Both figures are the startup probe's (a few short greedy requests when the checks last
            # ran: `up`, or `check` since), not the server's traffic.
            "figures_from": "startup probe" if probe else None, "probe_measured_at": probe.get("measured_at"),
            "checks": worst_status, "log": str(self.log_path),
        }


def _command_of(owner: ProcessIdentity) -> str:
    """The sparkit command a run's owner ran (`sparkit ladder`, from its command line), else
    `sparkit up`: what set the run up, as the user typed it."""
    argv = list(owner.cmdline or ())
    for i, arg in enumerate(argv[:-1]):
        if os.path.basename(arg) == "sparkit" and argv[i + 1].isalpha():
            return f"sparkit {argv[i + 1]}"
    return "sparkit up"


def write_json_atomic(path: Path, data: Any) -> None:
    """A reader sees the old file or the new one, never half of one (private: sparkit.paths)."""
    write_atomic(path, json.dumps(data, indent=2, default=str))


# -- finding runs ---------------------------------------------------------------------------------

def list_runs(root: Path | None = None) -> list[Run]:
    """Every readable run, oldest start first."""
    root = root or runs_dir()
    if not root.is_dir():
        return []
    check_private_dir(root, "sparkit's runs directory")
    found = []
    for path in root.iterdir():
        if not os.path.lexists(path / RunFiles.META) and not path.is_symlink():
            continue
        try:
            run = Run.open(path)  # a directory another user controls raises StateError: refused, not skipped
            found.append((_start_order(path), run))
        except (OSError, ValueError, TypeError, KeyError):
            continue  # a torn record (a crash mid-write of an old sparkit): not a run to act on
    return [run for _, run in sorted(found, key=lambda item: item[0])]


def _start_order(path: Path) -> tuple[str, float]:
    # By start time, not meta.json's mtime: stopping a run rewrites its record, and the run
    # stopped last must not become "the latest run".
    try:
        with open_state(path / RunFiles.META) as handle:
            started = json.loads(handle.read()).get("started_at") or ""
    except (OSError, ValueError, AttributeError):
        started = ""
    return (started, (path / RunFiles.META).stat().st_mtime)


@contextlib.contextmanager
def launch_lock(root: Path | None = None, *, wait_s: float = 120.0) -> Iterator[Callable[[], None]]:
    """Hold the runs directory's launch lock: one `up` at a time checks memory and records its run
    (so two servers started at once are judged one after the other, the second against what the
    first will take). Yields a release function (the launch calls it once its run and memory fit
    are on disk, long before the engine is up). An flock: a process that dies releases it. After
    `wait_s` without it, the launch goes ahead unserialised rather than hang."""
    import fcntl
    import time

    root = root or runs_dir()
    ensure_dir(root)
    handle = os.fdopen(os.open(root / RunFiles.LAUNCH_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600), "r+")  # private, as all state
    deadline = time.monotonic() + wait_s
    held = False
    try:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except OSError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
        released = False

        def release() -> None:
            nonlocal released
            if held and not released:
                released = True
                fcntl.flock(handle, fcntl.LOCK_UN)

        yield release
        release()
    finally:
        handle.close()


def live_runs() -> list[Run]:
    return [r for r in list_runs() if r.live]


def _settings(recipe: Any) -> Any:
    """A resolved recipe as it decides what a server serves: every setting but the port."""
    if not isinstance(recipe, dict):
        return None
    server = {k: v for k, v in (recipe.get("server") or {}).items() if k != "port"}
    return {**recipe, "server": server}


def run_serving(engine: str, recipe: dict[str, Any], *, port: int | None = None) -> Run | None:
    """The latest run in use (serving, or being started) that serves what a plan of `recipe` on
    `engine` would: the same resolved recipe, whatever port each was given, or on `port` when the
    caller names one. None when there is none."""
    wanted = _settings(recipe)
    for run in reversed(list_runs()):
        if not run.state.active or (port is not None and run.port != port) or not run.in_use:
            continue
        recorded = run.read_json(RunFiles.PLAN) or {}
        if recorded.get("engine") == engine and _settings(recorded.get("recipe")) == wanted:
            return run
    return None


def holder_of_port(port: int) -> tuple[str, Run | None] | None:
    """Who listens on `port`, in words, with its run when it is one of sparkit's (its id, recipe
    and pid); else the process (pid and name); None when nothing this user can see listens."""
    for run in reversed(live_runs()):
        if run.port == port:
            return f"sparkit run {run.id} ({run.recipe_name}, pid {run.pid})", run
    found = port_listener(port)
    if found is None:
        return None
    pid, name = found
    return ("a process of another user" if pid is None else f"pid {pid} ({name or 'name unknown'})"), None


def select_run(ref: str | None = None, *, include_stopped: bool = False) -> Run:
    """The one rule every command uses to pick a run.

    `ref` is a run id, an id prefix, or a recipe name (in full, or its last path segment); among
    the runs it matches, the latest live one, else the latest. Without `ref`: the latest live
    run, or with `include_stopped` (for reading a log) the latest run when none is live.
    Raises EngineError (exit 7) when no run is live and none was asked for by name, UsageError
    when `ref` matches nothing."""
    if ref is not None and not ref.strip():
        # An empty prefix matches every run: `sparkit down ""` (an unset shell variable) would
        # stop the latest one.
        raise UsageError("an empty RUN matches every run; name one", hint="`sparkit status` lists the runs")
    runs = list_runs()
    if ref is None:
        live = [r for r in runs if r.live]
        if live:
            return live[-1]
        if include_stopped and runs:
            return runs[-1]
        # Exit 7 like a --url where nothing answers: in both cases there is no server to talk to.
        raise EngineError("no running server found", hint="start one with `sparkit up`, or pass --url URL")
    exact = [r for r in runs if r.id == ref]
    matches = exact or [r for r in runs if r.id.startswith(ref) or ref in (r.recipe_name, r.recipe_name.rsplit("/", 1)[-1])]
    if not matches:
        raise UsageError(f"no run matches {ref!r}", hint="`sparkit status` lists the runs")
    live = [r for r in matches if r.live]
    return (live or matches)[-1]


@dataclass
class Server:
    """Where requests go: a URL, its key, and the run behind it when sparkit started it."""

    url: str
    api_key: str | None = None
    run: Run | None = None


def resolve_server(run: str | None = None, url: str | None = None, api_key: str | None = None) -> Server:
    """--url wins, else a run (select_run). A --url that is a live run's own URL is that run (its
    recipe, its startup checks, its key). `api_key` is the command's --api-key option; the key
    sent follows sparkit.api_key's precedence."""
    if url:
        url = url.rstrip("/")
        same = [r for r in live_runs() if r.url.rstrip("/") == url]
        if not same:
            return Server(url=url, api_key=client_key(api_key, started_by_sparkit=False))
        found = same[-1]
        return Server(url=url, api_key=client_key(api_key, started_by_sparkit=True, api_key_env=found.api_key_env), run=found)
    found = select_run(run)
    return Server(url=found.url, api_key=client_key(api_key, started_by_sparkit=True, api_key_env=found.api_key_env),
                  run=found)


def mark_stale() -> list[Run]:
    """Record what became of active runs that nobody stopped: an engine that died is exited; a
    start whose `sparkit up` died is failed, and a foreground engine that outlived its `sparkit
    up` is exited; both engines are stopped first (whatever PR_SET_PDEATHSIG did not reach). A
    run being set up is left alone. Secret files of runs that are over are removed."""
    stale = []
    for run in list_runs():
        if not run.state.active or run.setting_up:
            continue
        if run.pid is None and run.state is RunState.STARTING:
            _adopt_unrecorded_engine(run)
        why = run.abandoned()
        if why is None and run.live:
            continue
        if run.live:
            stop_group(run.pid, run.pgid, run.create_time, 5.0, run.cmdline)
        if run.unfinished_start() is not None:
            run.state, run.failure, run.phase = RunState.FAILED, why, None
        else:
            run.state = RunState.EXITED
        run.stopped_at = run.stopped_at or now_iso()
        run.save()
        remove_secret_files(run)
        stale.append(run)
    return stale


def _adopt_unrecorded_engine(run: Run) -> None:
    """A `sparkit up` killed between starting its engine and recording the pid leaves an engine
    nobody could stop: find it by the run directory in its environment and record it, so that it
    is stopped like any other (and the failure says the engine was starting)."""
    for pid in leaders_with_env(REPORT_DIR_ENV, str(run.path)):
        identity = ProcessIdentity.of(pid)
        if identity is None:
            continue
        run.pid = run.pgid = pid
        run.create_time = identity.create_time
        run.cmdline = list(identity.cmdline) if identity.cmdline else None
        return


def remove_secret_files(run: Run) -> None:
    """The engine read its key at start: the file that carried it need not outlive that."""
    try:
        names = get_adapter(run.engine).secret_files
    except Exception:  # an engine whose plugin is gone: nothing known to remove
        return
    for name in names:
        (run.path / name).unlink(missing_ok=True)


def prune_runs() -> list[str]:
    """Delete the directories of runs that are not in use (see Run.in_use); returns their ids."""
    import shutil

    removed = []
    for run in list_runs():
        if not run.in_use:
            shutil.rmtree(run.path, ignore_errors=True)
            removed.append(run.id)
    return removed


def follow_log(run: Run, *, from_start: bool = False, poll: float = 0.2,
               stop_when: Callable[[], bool] | None = None) -> Iterator[str]:
    """Yield lines of the run's log as they are written (like tail -f).

    Ends when `stop_when()` is true or the engine is gone and the log is drained."""
    with open_state(run.log_path, "r", errors="replace") as handle:
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
            interrupts.raise_if_pending()  # one the interpreter swallowed: this loop is where `up` serves
            if stop_when is not None and stop_when():
                return
            if not run.live:
                if buffer:
                    yield buffer
                return
            import time

            time.sleep(poll)


def new_run_id(recipe_name: str) -> str:
    import secrets

    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in recipe_name) or "run"
    return f"{safe}-{stamp}-{secrets.token_hex(2)}"


def now_iso() -> str:
    return datetime.now(UTC).isoformat()
