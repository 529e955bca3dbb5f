"""`sparkit up`: start a server from a recipe, show its preflight and startup checks, stream its log.
`start`, `report_started` and `render_checks` are also what `run`, `chat` and `check` show."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from typing import Any

import typer

from sparkit import interrupts
from sparkit.cli import options
from sparkit.cli.common import console, err_console, print_json, signals_as_interrupt

_STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def _parse_port(value: str | None) -> int | str | None:
    from sparkit.errors import UsageError

    if value is None:
        return None
    if value == "auto":
        return "auto"
    try:
        port = int(value)
    except ValueError:
        raise UsageError(f"--port {value!r}: expected 'auto' or a port number") from None
    if not 0 < port < 65536:
        raise UsageError(f"--port {port}: out of range 1-65535")
    return port


def render_checks(results: list, title: str = "startup checks", stderr: bool = False) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, show_lines=False, title_justify="left")
    table.add_column("check")
    table.add_column("status")
    table.add_column("detail", overflow="fold")
    for r in results:
        status = r.status.value
        detail = escape(r.detail)
        if r.status.value in ("fail", "warn"):
            if r.cause:
                detail += f"\n[dim]cause:[/] {escape(r.cause)}"
            if r.fix:
                detail += f"\n[dim]fix:[/] {escape(r.fix)}"
            for line in r.evidence[:4]:
                detail += f"\n[dim]· {escape(line)}[/]"
        table.add_row(r.title, f"[{_STATUS_STYLE.get(status, '')}]{status}[/]", detail)
    (err_console() if stderr else console()).print(table)


def guard_line(guard: dict | None) -> str:
    """What the load guard did while the engine started, in one line."""
    from sparkit.memory.units import gib

    if not guard:
        return "memory guard: no record"
    if not guard.get("enabled"):
        return f"memory guard off: {guard.get('reason', '')}"
    line = (f"memory guard: lowest available {gib(guard['min_available'])} (floor {gib(guard['floor_bytes'])}, "
            f"peak use {gib(guard['peak_used'])} over {guard['samples']} samples); ")
    if guard.get("evictions"):
        line += (f"evicted {gib(guard['evicted_bytes'])} of the checkpoint's page cache in {guard['evictions']} "
                 f"pass{'es' if guard['evictions'] != 1 else ''}")
    else:
        line += "evicted nothing (free memory stayed above the floor)"
    return line


def _say(message: str) -> None:
    """A message on stderr, if there is still a terminal to show it (after SIGHUP there is not;
    stopping the server must not depend on it)."""
    try:
        err_console().print(message)
    except (OSError, ValueError):
        pass


class _PhaseLine:
    """The live one-line progress of a start (build percentage, then the engine's phase)."""

    def __init__(self) -> None:
        from rich.live import Live
        from rich.text import Text

        self._text = Text
        self.live = Live(Text(""), console=err_console(), transient=True, refresh_per_second=4)

    def __call__(self, event: Any) -> None:
        line = f"[{event.elapsed_s:6.1f}s] {event.phase}"
        if event.fraction is not None:
            line += f" {event.fraction * 100:5.1f}%"
        if event.message:
            line += f"  {event.message}"
        if not self.live.is_started:
            interrupts.held(self.live.start)  # a refresh thread starts: held (sparkit.interrupts)
        self.live.update(self._text(line, style="cyan", no_wrap=True, overflow="ellipsis"))

    def close(self) -> None:
        if self.live.is_started:
            self.live.stop()


def up(
    recipe: options.LaunchRecipe = None,
    set_: options.Overrides = (),
    port: str = typer.Option(None, "--port", metavar="PORT", help="'auto' (a free port) or a port number; default: the recipe's."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Return once the checks ran, leaving the server running."),
    timeout: options.HealthTimeout = 600.0,
    keep_on_fail: bool = typer.Option(False, "--keep-on-fail", help="Keep the server running when a startup check fails."),
    pull_first: bool = typer.Option(False, "--pull", help="Pull a hub model that is not here first (as `sparkit pull` does), instead of refusing."),
    new: bool = typer.Option(False, "--new", help="Start another server even when one already serves this recipe with the same settings."),
    json_out: options.Json = False,
) -> None:
    """A server already running the recipe with the same settings is named and reused (--new starts
    another). A hub model is loaded from its local copy (`sparkit pull`); the engine never downloads."""
    from sparkit.errors import CheckFailed
    from sparkit.runs import stop

    # Ctrl-C too: noted before it raises, so that one the interpreter swallows while the engine
    # starts (a fork hook) is raised again at the next phase (sparkit.interrupts).
    signals_as_interrupt(sigint=True)
    try:
        started, plan = start(recipe, list(set_), port, detach=detach, timeout=timeout, keep_on_fail=keep_on_fail,
                              pull_first=pull_first, reuse=not new)
    except AlreadyServing as same:
        _report_reused(same.run, json_out)
        return
    run = started.run
    if detach:
        report_started(started, plan, json_out, keep_on_fail, detach)
        err_console().print(f"serving at [bold]{plan.url}[/] (detached; `sparkit down {run.id}` stops it)", soft_wrap=True)
        return
    try:
        report_started(started, plan, json_out, keep_on_fail, detach)
        err_console().print(f"serving at [bold]{plan.url}[/]; Ctrl-C stops it. Log follows.", soft_wrap=True)
    except CheckFailed:
        raise  # already stopped, or kept on purpose (--keep-on-fail)
    except BaseException:  # Ctrl-C, SIGHUP or a closed terminal before the log streams
        stop(run)
        raise
    _stream_until_interrupt(run, sys.stderr if json_out else sys.stdout)


class AlreadyServing(Exception):
    """`up` of what a run already serves (the same recipe, resolved to the same settings)."""

    def __init__(self, run: Any) -> None:
        super().__init__(run.id)
        self.run = run


def start(recipe: str | None, set_: list[str], port: str | None, *, detach: bool, timeout: float,
          keep_on_fail: bool = False, pull_first: bool = False, reuse: bool = False) -> tuple[Any, Any]:
    """Load, preflight, build, launch and check a recipe's server, showing each step on stderr:
    what `up` and `run` share. Returns (Started, LaunchPlan); the startup checks' report is the
    caller's to show (`report_started`). `reuse`: a live run of the same recipe and settings (on
    the port asked for, when one is) raises AlreadyServing, and one still starting is exit 4."""
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import DEFAULT_RECIPE, load_recipe
    from sparkit.runs import free_port
    from sparkit.runs import up as start_server
    from sparkit.runs.pipeline import host_preflight

    wanted_port = _parse_port(port)
    loaded = load_recipe(recipe or DEFAULT_RECIPE, list(set_))
    _shown_on_failure(lambda: host_preflight(loaded.recipe))  # a GPU recipe on a CPU host: at once, before compiling
    asked_port = wanted_port
    if reuse:  # here, before compiling; again under the launch lock, against an `up` begun meanwhile
        _refuse_a_duplicate(loaded, asked_port)
    if wanted_port == "auto":
        wanted_port = free_port()
    plan = compile_plan(loaded, port=wanted_port)
    if pull_first and any(not p.get("local") for p in plan.model_pulls):
        from sparkit.cli.commands.pull import pull_for_plan

        pull_for_plan(plan)
        plan = compile_plan(loaded, port=wanted_port)  # now on the local snapshot

    phase_line = _PhaseLine()
    checking = err_console().status("running startup checks (probe: a few greedy requests)")

    def on_checking(run: Any) -> None:
        phase_line.close()
        err_console().print(f"[green]ready[/] {plan.url}  run {run.id}  log {run.log_path}", soft_wrap=True)
        err_console().print(guard_line(run.memory_guard), highlight=False, soft_wrap=True)
        interrupts.held(checking.start)

    try:
        with _ctrl_c_says_stopping(phase_line, checking):
            # --keep-on-fail may leave the server running after this command exits 6, so the kernel
            # must not end it with the command.
            started = start_server(plan, timeout=timeout, detach=detach, tie_to_parent=not (detach or keep_on_fail),
                                   on_preflight=lambda results: render_checks(results, title="preflight", stderr=True),
                                   on_progress=phase_line, on_checking=on_checking,
                                   under_lock=(lambda: _refuse_a_duplicate(loaded, asked_port)) if reuse else None)
    finally:
        phase_line.close()
        checking.stop()
    return started, plan


def _refuse_a_duplicate(loaded: Any, wanted_port: int | str | None) -> None:
    """Raise AlreadyServing for a live run serving the recipe with the same settings (on the port
    asked for: `--port N`, or server.port set by --set; any port otherwise), PreflightError (exit
    4) for one that is still starting."""
    from sparkit.errors import PreflightError
    from sparkit.runs import RunState, mark_stale, run_serving

    mark_stale()  # what a killed `up` or ladder left is recorded first, not taken for a server
    origin = loaded.origins.get(("server", "port"))
    asked = wanted_port if isinstance(wanted_port, int) else (
        loaded.recipe.server.port if origin is not None and origin.file == "--set" else None)
    same = run_serving(loaded.recipe.engine, loaded.resolved(), port=asked)
    if same is None:
        return
    if same.observed_state() is RunState.RUNNING:
        raise AlreadyServing(same)
    owner = same.owner_identity
    raise PreflightError(f"{same.recipe_name} is being started with the same settings by run {same.id} "
                         f"(`sparkit up`, pid {owner.pid if owner else '?'}) at {same.url}",
                         hint="wait for it (`sparkit status`), or `sparkit up --new` starts another")


def _report_reused(run: Any, json_out: bool) -> None:
    """What `up` says of the run that already serves the recipe: its id and URL, and how to go on."""
    if json_out:
        print_json({"run": run.id, "url": run.url, "pid": run.pid, "log": str(run.log_path), "reused": True})
    err_console().print(f"{run.recipe_name} is already running with the same settings: run {run.id} at "
                        f"[bold]{run.url}[/] (pid {run.pid}); reusing it. `sparkit up --new` starts another, "
                        f"`sparkit logs -f {run.id}` follows its log, `sparkit down {run.id}` stops it",
                        highlight=False, soft_wrap=True)


def _shown_on_failure(preflight: Any) -> None:
    """Run an early preflight; a failure shows its table (as the full preflight would) and raises."""
    from sparkit.errors import PreflightError

    try:
        preflight()
    except PreflightError as exc:
        render_checks(getattr(exc, "results", []), title="preflight", stderr=True)
        raise


@contextlib.contextmanager
def _ctrl_c_says_stopping(phase_line: Any, checking: Any) -> Iterator[None]:
    """Ctrl-C while a server starts: say at once that it is being stopped (stopping takes up to
    the grace period), and once it is, that nothing is left; a second Ctrl-C does not cut the stop
    short (the engine would be left behind)."""

    interrupted = {"count": 0}
    previous = signal.getsignal(signal.SIGINT)

    def on_interrupt(signum: int, frame: Any) -> None:
        interrupts.note(signum)
        interrupted["count"] += 1
        if interrupted["count"] > 1:
            _say("[yellow]still stopping the engine[/] (SIGKILL follows the grace period)")
            return
        phase_line.close()
        checking.stop()
        _say("[yellow]interrupted:[/] stopping the engine ...")
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    except KeyboardInterrupt:
        if interrupted["count"] == 0:  # SIGTERM or SIGHUP (signals_as_interrupt): say it now
            _say("[yellow]interrupted:[/] stopping the engine ...")
        _say("stopped; nothing is left running")
        raise
    finally:
        signal.signal(signal.SIGINT, previous)


def report_started(started: Any, plan: Any, json_out: bool, keep_on_fail: bool, detach: bool,
                    stderr: bool = False) -> None:
    """The startup checks' report (on stderr with --json, or `stderr`); a failed check stops the
    server (unless --keep-on-fail) and raises CheckFailed."""
    from sparkit.errors import CheckFailed
    from sparkit.runs import stop

    run, results = started.run, started.checks
    if json_out:
        print_json(
            {
                "run": run.id,
                "url": plan.url,
                "pid": run.pid,
                "log": str(run.log_path),
                "preflight": [r.to_dict() for r in started.preflight],
                "memory_guard": run.memory_guard,
                "checks": [r.to_dict() for r in results],
                "ok": started.ok,
            }
        )
    render_checks(results, stderr=json_out or stderr)
    if not started.ok:
        names = ", ".join(r.title for r in started.failed_checks)
        if keep_on_fail:
            if not run.detached:  # it outlives this command now: a detached run from here on
                run = run.reload()
                run.detached = True
                run.save()
            err_console().print(f"[yellow]kept running despite failed checks[/] ({names}): `sparkit down {run.id}`")
        else:
            stop(run)
        raise CheckFailed(
            f"startup check(s) failed: {names}",
            hint="see the table above for the cause and fix" + ("" if keep_on_fail else "; the server was stopped (use --keep-on-fail to keep it)"),
        )


def _stream_until_interrupt(run: Any, out: Any) -> None:
    """Foreground mode: print the engine's log as it grows; Ctrl-C (or SIGTERM) stops the server."""
    from sparkit.errors import LaunchError
    from sparkit.runs import follow_log, stop

    try:
        for line in follow_log(run, from_start=False):
            out.write(line + "\n")
            out.flush()
    except KeyboardInterrupt:
        _say("stopping the server ...")
        stop(run)
        _say("stopped.")
        raise
    except BaseException:  # a closed terminal (EIO on write), anything: the server goes with us
        stop(run)
        raise
    if not run.live:
        stop(run)
        raise LaunchError(f"the server exited (run {run.id})", hint=f"`sparkit logs {run.id}` shows why")
