"""Starting and stopping an engine for a plan.

`launch(plan)` has the engine's adapter prepare what must exist (built-in model builds), starts
the engine in its own process group (its log in the run directory), follows its startup phase,
waits for /health, and on any failure (exit, timeout, Ctrl-C) stops the group and raises
LaunchError with the adapter's diagnosis; `stop(run)` ends the group and records it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sparkit.runs.processes as processes
from sparkit import interrupts
from sparkit.api_key import engine_environ, recipe_key
from sparkit.client import check_health
from sparkit.contract.engine import STARTUP_PHASES, EngineAdapter
from sparkit.contract.log import Diagnosis
from sparkit.contract.plan import LaunchPlan
from sparkit.engines.activation_report import REPORT_DIR_ENV
from sparkit.engines.base import get_adapter
from sparkit.engines.startup_log import tail_lines
from sparkit.errors import LaunchError, StateError
from sparkit.memory.checkpoint_location import plan_checkpoint_dirs
from sparkit.memory.floor import floor_bytes, guard_settings
from sparkit.memory.guard import GUARD_LOG, LoadGuard, guard_supported
from sparkit.memory.meminfo import read_meminfo
from sparkit.memory.oom import OomWatch
from sparkit.memory.pagecache import weight_files
from sparkit.paths import ensure_dir, free_bytes, open_output, open_state, write_error
from sparkit.runs.store import Run, RunFiles, RunState, new_run_id, now_iso


@dataclass
class LaunchProgress:
    """One progress event of `launch` (for a live phase line)."""

    phase: str  # "building model", or one of sparkit.contract.engine.STARTUP_PHASES
    elapsed_s: float
    message: str = ""
    fraction: float | None = None  # known only while building a model


ProgressFn = Callable[[LaunchProgress], None]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (for --port auto, and transient servers)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host if host not in ("0.0.0.0", "") else "127.0.0.1", 0))
        return sock.getsockname()[1]


def _secret_delivery(plan: LaunchPlan, adapter: EngineAdapter, run: Run) -> tuple[dict[str, str], list[str]]:
    """How the API key reaches the engine without appearing in argv or plan.json (the engine's
    adapter knows: an environment variable, or a private file)."""
    if not plan.api_key_env:
        return {}, []
    secret = recipe_key(plan.api_key_env)
    if not secret:
        raise LaunchError(
            f"the recipe asks for an API key from ${plan.api_key_env}, which is not set",
            hint=f"export {plan.api_key_env}=... before `sparkit up`",
        )
    return adapter.deliver_secret(secret, run.path)


def _launch_failure(run: Run, adapter: EngineAdapter, summary: str, returncode: int | None,
                    oom: Any = None) -> LaunchError:
    text = run.read_log()
    diagnosis = adapter.diagnose(text, returncode)
    if returncode is not None and returncode < 0 and oom is not None:
        diagnosis = _killed(diagnosis, returncode, oom)
    diagnosis = _disk_full(diagnosis, run)
    run = run.reload()
    run.state, run.failure, run.stopped_at = RunState.FAILED, diagnosis.cause, now_iso()
    _save_if_possible(run)
    lines = "\n".join(f"    {line}" for line in tail_lines(text, 25)) or "    (the log is empty)"
    error = LaunchError(f"{summary} ({diagnosis.cause}): {diagnosis.detail}\n  last log lines ({run.log_path}):\n{lines}",
                        hint=diagnosis.hint)
    error.run = run  # type: ignore[attr-defined]
    error.diagnosis = diagnosis  # type: ignore[attr-defined]
    return error


def _disk_full(diagnosis: Any, run: Run) -> Any:
    """An engine whose log could not be written (the disk filled while it started) dies of it or
    with a log cut short: say so rather than guess from the log."""
    free = free_bytes(run.path)
    if free is None or free >= 64 * 1024:
        return diagnosis
    return Diagnosis("disk full", f"the file system holding {run.path} has {free // 1024} KiB left, so the engine's "
                     f"log (and the engine) could not go on ({diagnosis.cause} otherwise)",
                     f"free space there (`df -h {run.path}`), then run `sparkit up` again")


def _killed(diagnosis: Any, returncode: int, oom: Any) -> Any:
    """A signal ended the engine: the OOM killer when the kernel recorded it, else what the log
    said, else the signal, with what was checked for an OOM kill."""
    from dataclasses import replace

    evidence, checked = oom.evidence()
    if evidence:
        return Diagnosis("out of memory (OOM killer)", f"the kernel's OOM killer ended the engine ({evidence[0]})",
                         "lower server.mem_fraction_static, model.context_length or the CUDA graph batch sizes; "
                         "stop other programs using memory", evidence[0])
    if diagnosis.cause.startswith("killed by"):
        return replace(diagnosis, detail=f"{diagnosis.detail}; no OOM kill was recorded ({'; '.join(checked)})")
    return diagnosis


def launch(plan: LaunchPlan, *, on_progress: ProgressFn | None = None, timeout: float = 600,
           detach: bool = True, tie_to_parent: bool | None = None, memory_fit: dict | None = None,
           on_recorded: Callable[[Run], None] | None = None) -> Run:
    """Start the engine of `plan` in its own process group and wait until /health answers.

    Preflight is the caller's job (sparkit.runs.pipeline.up does it). The engine's stdout+stderr
    go to the run's server.log; its environment is os.environ (less the variables the engine
    reads a key from, sparkit.api_key) + plan.env + SPARKIT_REPORT_DIR=<run dir> + the recipe's key. On any failure the process group is stopped before the error
    propagates, so nothing is left running.

    `detach` False records a foreground run (it lives as long as this process: `sparkit status`
    stops one whose process died). `tie_to_parent` (default: not `detach`) has the kernel end the
    engine when the thread calling `launch` dies, SIGKILL included; off for a server that may have
    to outlive the command (`up --keep-on-fail`).

    `memory_fit` (preflight's, sparkit.memory.fit) is recorded in the run directory, so that a
    launch while this one starts reserves what it will hold; `on_recorded` is called once the run
    and its memory fit are on disk (sparkit.runs.pipeline.up releases the launch lock there)."""
    t0 = time.monotonic()

    def emit(phase: str, message: str = "", fraction: float | None = None) -> None:
        if on_progress is not None:
            on_progress(LaunchProgress(phase, time.monotonic() - t0, message, fraction))

    adapter = get_adapter(plan.engine)
    run = _record_new_run(plan, detach, memory_fit)
    if on_recorded is not None:
        on_recorded(run)

    argv, env, preexec = _prepared(plan, adapter, run, tie_to_parent if tie_to_parent is not None else not detach, emit)
    # A signal while the engine forks (a preexec_fn runs the interpreter's fork hooks, where a
    # KeyboardInterrupt is swallowed; later in Popen it would lose the child) is held until the
    # engine is known to this process, then raised below, which stops it.
    with interrupts.deferred():
        proc = _spawn(run, argv, env, preexec, adapter.install_hint)
        processes.children[proc.pid] = proc
        run.pid = run.pgid = proc.pid  # start_new_session: the child leads its own group
    guard = None
    try:
        started = processes.ProcessIdentity.of(proc.pid)  # Popen returns after exec: the engine's argv
        run.create_time = started.create_time if started else None
        run.cmdline = list(started.cmdline) if started and started.cmdline else None
        run.save()  # a full disk here: the engine is stopped, not left running unrecorded
        interrupts.raise_if_pending()
        # The guard's thread starts held (sparkit.interrupts): CI met "RuntimeError: release
        # unlocked lock" for a SIGHUP sent the moment the engine's pid was recorded.
        oom = OomWatch.start(proc.pid)
        guard = interrupts.held(lambda: _start_guard(plan, run, proc))
        try:
            _wait_healthy(run, adapter, proc, plan, timeout, emit, t0, guard, oom)
        finally:
            # The engine read its key at start; it need not stay on disk.
            for name in adapter.secret_files:
                (run.path / name).unlink(missing_ok=True)
            _record_guard(run, guard)
        interrupts.raise_if_pending()
        run = run.reload()
        run.state, run.ready_s = RunState.RUNNING, round(time.monotonic() - t0, 2)
        run.save()
    except BaseException as exc:  # exit, timeout, Ctrl-C, a full disk: leave nothing behind
        _stop_quietly(run, exc)
        raise
    emit("ready")
    return run


def _prepared(plan: LaunchPlan, adapter: EngineAdapter, run: Run, tie: bool,
              emit: Callable[..., None]) -> tuple[list[str], dict[str, str], Callable[[], None] | None]:
    """(argv, environment, preexec_fn) of the engine once what it needs exists (built-in models,
    its key); a start that fails or is interrupted here is recorded as failed."""
    try:
        adapter.prepare(plan, lambda fraction, message: emit("building model", message, fraction))
        secret_env, extra_argv = _secret_delivery(plan, adapter, run)
        interrupts.raise_if_pending()  # one the interpreter swallowed while the model was built
        # The engine's key is the recipe's or none (sparkit.api_key): a key variable the engine would
        # read by itself is dropped from what it inherits, then the recipe's key is delivered.
        env = {**engine_environ(os.environ, adapter.key_env), **plan.env, REPORT_DIR_ENV: str(run.path), **secret_env}
        env.setdefault("PYTHONUNBUFFERED", "1")  # the phase line reads the log as it is written
        argv = list(plan.argv) + extra_argv
        # A foreground server lives as long as the command that holds it, even one killed with
        # SIGKILL (the kernel tells the engine); a detached one must outlive it.
        preexec = processes.die_with_parent() if tie else None
        emit("starting", " ".join(argv[1:4])[:100])
        return argv, env, preexec
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            why = "interrupted while preparing the launch (building the model)"
        else:
            why = f"not started: {exc}".splitlines()[0][:200]
        run.state, run.failure, run.stopped_at = RunState.FAILED, why, now_iso()
        _save_if_possible(run)
        raise


def _record_new_run(plan: LaunchPlan, detach: bool, memory_fit: dict | None) -> Run:
    """A new run directory (0700) holding the plan, the memory fit and the run record."""
    owner = processes.ProcessIdentity.of(os.getpid())
    run = Run(id=new_run_id(plan.recipe_name), recipe_name=plan.recipe_name, recipe_path=plan.recipe_path,
              engine=plan.engine, url=plan.url, host=plan.host, port=plan.port, started_at=now_iso(),
              api_key_env=plan.api_key_env, detached=detach, owner=owner.to_dict() if owner else None)
    ensure_dir(run.root)
    try:
        run.path.mkdir(exist_ok=False, mode=0o700)
    except OSError as exc:
        raise write_error(run.path, exc) from None
    try:
        run.write_json(RunFiles.PLAN, plan.to_dict())
        if memory_fit is not None:
            run.write_json(RunFiles.MEMORY, memory_fit)
        run.save()
    except BaseException:
        # Nothing started and no record to keep (a full disk, Ctrl-C): no empty run directory either.
        shutil.rmtree(run.path, ignore_errors=True)
        raise
    return run


def _spawn(run: Run, argv: list[str], env: dict[str, str], preexec: Callable[[], None] | None,
           install_hint: str) -> subprocess.Popen:
    """The engine's process, leading its own group, writing to the run's log; a run that could not
    start is recorded as failed."""
    try:
        log_file = open_output(run.log_path, "ab")
    except (OSError, StateError) as exc:
        run.state, run.failure, run.stopped_at = RunState.FAILED, f"not started: {exc}".splitlines()[0][:200], now_iso()
        _save_if_possible(run)
        raise
    with log_file as log:
        try:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True, preexec_fn=preexec)
        except FileNotFoundError as exc:
            run.state, run.failure = RunState.FAILED, "engine not installed"
            run.save()
            raise LaunchError(f"engine not installed: cannot execute {argv[0]!r} ({exc.strerror})",
                              hint=install_hint) from exc


def _stop_quietly(run: Run, cause: BaseException) -> None:
    """Stop a start that failed, keeping the failure that is on its way to the user (a record that
    cannot be written then is not the news; the cause is). A second Ctrl-C does not cut the stop
    short: the engine would be left behind, its record saying it starts."""
    try:
        with interrupts.deferred():
            stop(run, grace=5)
    except StateError:
        pass
    if isinstance(cause, KeyboardInterrupt):
        interrupts.clear()  # the interrupt on its way is the one held meanwhile
    if isinstance(cause, StateError):  # the record names what could not be written, if it can be written
        try:
            run = run.reload()
            if run.state is not RunState.FAILED:
                run.state, run.failure = RunState.FAILED, str(cause.message)[:200]
                run.save()
        except (OSError, ValueError, TypeError, StateError):
            pass


def _save_if_possible(run: Run) -> None:
    """Record a failure while another error is on its way to the user (which names the cause);
    on a full disk the record is rewritten in place when it can be (sparkit.paths.write_atomic)."""
    try:
        run.save()
    except (OSError, StateError):
        pass


def _start_guard(plan: LaunchPlan, run: Run, proc: subprocess.Popen):
    """The load guard over this engine (None when the recipe turns it off or the OS cannot run it;
    the run's record says which)."""
    settings = guard_settings(plan.recipe)
    unsupported = guard_supported()
    if not settings.get("enabled", True) or unsupported:
        run = run.reload()
        run.memory_guard = {"enabled": False, "reason": unsupported or "server.memory_guard.enabled is false"}
        run.save()
        return None

    pgid = proc.pid
    return LoadGuard(
        pgid=pgid,
        files=weight_files(plan_checkpoint_dirs(plan)),
        floor_bytes=floor_bytes(plan.recipe, read_meminfo().total),
        log_path=run.path / GUARD_LOG,
        alive=lambda: proc.poll() is None or processes.group_alive(pgid),
    ).start()


def _record_guard(run: Run, guard: Any) -> None:
    if guard is None:
        return
    with interrupts.deferred():  # stopping joins its thread; the caller raises a held signal next
        summary = guard.stop()
    run = run.reload()
    run.memory_guard = {"enabled": True, **summary.to_dict()}
    _save_if_possible(run)  # a full disk: the start's own outcome (or error) says so


def _guard_failure(run: Run, guard: Any, phase: str) -> LaunchError:
    """The engine was stopped by the load guard: what happened, in numbers, and what to change."""
    gib = 1024**3
    s = guard.summary
    run = run.reload()
    run.state, run.failure, run.stopped_at = RunState.FAILED, "stopped by the memory guard", now_iso()
    _save_if_possible(run)
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


def _wait_healthy(run: Run, adapter: EngineAdapter, proc: subprocess.Popen, plan: LaunchPlan, timeout: float,
                  emit: Callable[..., None], t0: float, guard: Any = None, oom: Any = None) -> None:
    phases = STARTUP_PHASES
    deadline = t0 + timeout
    key = recipe_key(plan.api_key_env)
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
            index = min(phases.index(adapter.startup_phase(line)), phases.index("warming up"))
            if index > state["phase"]:  # every phase crossed is shown, in order
                state["phase"] = index
                emit(phases[index], state["last_line"])
                state["last_emit"] = now

    with open_state(run.log_path, "r", errors="replace") as log:
        while True:
            if guard is not None and guard.tripped.is_set():
                guard.stop()  # waits until the guard has stopped the engine
                raise _guard_failure(run, guard, phases[state["phase"]])
            code = proc.poll()
            if code is not None:
                if guard is not None and guard.tripped.is_set():
                    continue  # the guard stopped it: its message, not "exited"
                raise _launch_failure(run, adapter, "the engine exited during start", code, oom)
            read_phases(log)
            interrupts.raise_if_pending()
            now = time.monotonic()
            if now - state["last_emit"] >= 1.0:
                emit(phases[state["phase"]], state["last_line"])
                state["last_emit"] = now
            if check_health(plan.url, api_key=key):
                # What the engine logged between the read above and its first 200 is shown too
                # (under load a whole start can fit in that gap).
                read_phases(log)
                return
            if now >= deadline:
                raise _launch_failure(run, adapter, f"the engine did not become healthy within {timeout:g} s", None)
            time.sleep(0.25)


def stop(run: Run, grace: float = 10) -> Run:
    """SIGTERM to the run's process group, SIGKILL after `grace` seconds; waits until it is gone
    and records it (a run that failed to start stays failed). Returns the updated record. A
    process that is not provably the recorded engine (its pid was reused) is never signalled."""
    owner = run.owner_identity
    if run.pid is None and run.setting_up and owner is not None and owner.pid != os.getpid():
        # No engine yet (a model builds): the `sparkit up` doing it is what to stop; it records
        # the run as failed (interrupted) itself.
        processes.stop_process(owner, grace)
    processes.stop_group(run.pid, run.pgid, run.create_time, grace, run.cmdline)
    try:
        run = run.reload()
    except (OSError, ValueError, TypeError):
        return run  # its directory was removed meanwhile: nothing to record
    if run.state is not RunState.FAILED:
        run.state = RunState.STOPPED
    run.stopped_at = run.stopped_at or now_iso()
    try:
        run.save()
    except StateError as exc:
        raise StateError(f"stopped run {run.id}, but its record could not be updated ({exc.message}); "
                         "`sparkit status` shows it as exited until it can be", hint=exc.hint) from None
    return run
