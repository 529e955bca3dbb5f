"""`sparkit up | status | logs | down | check`: start a server, see it, stop it, re-check it."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from datetime import UTC
from typing import Any

import typer

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
            self.live.start()
        self.live.update(self._text(line, style="cyan", no_wrap=True, overflow="ellipsis"))

    def close(self) -> None:
        if self.live.is_started:
            self.live.stop()


def up(
    recipe: str = typer.Argument(None, help="Recipe file or shipped name (default: the tiny CPU recipe)."),
    set_: list[str] = typer.Option([], "--set", help="Override a recipe value: a.b=c (repeatable)."),
    port: str = typer.Option(None, "--port", help="'auto' (a free port) or a port number; default: the recipe's."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Return once the checks ran, leaving the server running."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds to wait for the server to become healthy."),
    keep_on_fail: bool = typer.Option(False, "--keep-on-fail", help="Keep the server running when a startup check fails."),
    pull_first: bool = typer.Option(False, "--pull", help="Pull a hub model that is not here first (as `sparkit pull` does), instead of refusing."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout (progress and messages on stderr)."),
) -> None:
    """Start a server from a recipe, prove each optimisation is active, then stream its log (or --detach).

    A hub model is loaded from its local copy (`sparkit pull`); the engine never downloads."""
    from sparkit.errors import CheckFailed
    from sparkit.runs import stop

    signals_as_interrupt()
    started, plan = start(recipe, list(set_), port, detach=detach, timeout=timeout, keep_on_fail=keep_on_fail,
                          pull_first=pull_first)
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


def start(recipe: str | None, set_: list[str], port: str | None, *, detach: bool, timeout: float,
          keep_on_fail: bool = False, pull_first: bool = False) -> tuple[Any, Any]:
    """Load, preflight, build, launch and check a recipe's server, showing each step on stderr:
    what `up` and `run` share. Returns (Started, LaunchPlan); the startup checks' report is the
    caller's to show (`report_started`)."""
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import DEFAULT_RECIPE, load_recipe
    from sparkit.runs import free_port
    from sparkit.runs import up as start_server
    from sparkit.runs.pipeline import host_preflight

    wanted_port = _parse_port(port)
    loaded = load_recipe(recipe or DEFAULT_RECIPE, list(set_))
    _shown_on_failure(lambda: host_preflight(loaded.recipe))  # a GPU recipe on a CPU host: at once, before compiling
    if wanted_port == "auto":
        wanted_port = free_port()
    plan = compile_plan(loaded, port=wanted_port)
    if pull_first and any(not p.get("local") for p in plan.model_pulls):
        from sparkit.cli.pull_cmd import pull_for_plan

        pull_for_plan(plan)
        plan = compile_plan(loaded, port=wanted_port)  # now on the local snapshot

    phase_line = _PhaseLine()
    checking = err_console().status("running startup checks (probe: a few greedy requests)")

    def on_checking(run: Any) -> None:
        phase_line.close()
        err_console().print(f"[green]ready[/] {plan.url}  run {run.id}  log {run.log_path}", soft_wrap=True)
        err_console().print(guard_line(run.memory_guard), highlight=False, soft_wrap=True)
        checking.start()

    try:
        with _ctrl_c_says_stopping(phase_line, checking):
            # --keep-on-fail may leave the server running after this command exits 6, so the kernel
            # must not end it with the command.
            started = start_server(plan, timeout=timeout, detach=detach, tie_to_parent=not (detach or keep_on_fail),
                                   on_preflight=lambda results: render_checks(results, title="preflight", stderr=True),
                                   on_progress=phase_line, on_checking=on_checking)
    finally:
        phase_line.close()
        checking.stop()
    return started, plan


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


def status(
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout (progress and messages on stderr)."),
    all_: bool = typer.Option(False, "--all", "-a", help="Also list stopped and failed runs."),
    prune: bool = typer.Option(False, "--prune", help="Delete the directories of runs that are not running."),
) -> None:
    """List servers: id, recipe, engine, URL, pid, uptime, health, last tok/s and accept length."""
    from sparkit.runs import list_runs, mark_stale, prune_runs

    stale = mark_stale()
    removed = prune_runs() if prune else []
    rows = [r.status() for r in list_runs()]
    if not all_:
        rows = [r for r in rows if r["state"] in ("running", "starting") or r["id"] in {s.id for s in stale}]
    if json_out:
        print_json({"runs": rows, "pruned": removed, "stale": [s.id for s in stale]})
        return
    if not rows:
        err_console().print("no servers running" + (f" (pruned {len(removed)})" if removed else "") + "; start one with `sparkit up`")
        return
    from sparkit.cli.common import is_terminal

    if not is_terminal(sys.stdout):
        _print_status_plain(rows)
    else:
        _print_status_table(rows)
    if any(r["decode_tok_s"] or r["accept_length"] for r in rows):
        err_console().print(PROBE_NOTE, highlight=False)


# What the status figures are: said under the table, since a header has no room for it.
PROBE_NOTE = ("tok/s and accept: the startup probe's (a few short greedy requests when the startup checks "
              "last ran: `sparkit up`, or `sparkit check` since), not the server's traffic; "
              "`sparkit bench` measures a workload")


_STATUS_COLUMNS = ("run", "recipe", "engine", "url", "pid", "state", "uptime", "health", "tok/s", "accept", "checks")


def _status_cells(r: dict[str, Any]) -> dict[str, str]:
    """One run (sparkit.runs.Run.status) as plain strings, one per column; '-' for what is not
    known (never empty, so a line splits on whitespace into exactly one field per column)."""
    return {
        "run": r["id"], "recipe": r["recipe"] or "-", "engine": r["engine"] or "-", "url": r["url"],
        "pid": str(r["pid"] or "-"), "state": r["state"], "uptime": _duration(r["uptime_s"]),
        "health": "-" if r["healthy"] is None else ("ok" if r["healthy"] else "down"),
        "tok/s": f"{r['decode_tok_s']:.1f}" if r["decode_tok_s"] else "-",
        "accept": f"{r['accept_length']:.2f}" if r["accept_length"] else "-",
        "checks": r["checks"] or "-",
    }


def _print_status_plain(rows: list) -> None:
    """Piped or redirected: a header and one run per line, columns aligned with spaces, no value
    cut or wrapped (scripts split it with awk/cut; people read it in a log)."""
    cells = [_status_cells(r) for r in rows]
    widths = {c: max(len(c), *(len(row[c]) for row in cells)) for c in _STATUS_COLUMNS}
    for row in [dict(zip(_STATUS_COLUMNS, _STATUS_COLUMNS)), *cells]:
        sys.stdout.write("  ".join(row[c].ljust(widths[c]) for c in _STATUS_COLUMNS).rstrip() + "\n")
    sys.stdout.flush()


def _print_status_table(rows: list) -> None:
    """On a terminal: a table when every column fits on one line; else two lines per run, the
    run id and URL first and whole (they are copied into the next command), the rest after."""
    from rich.markup import escape
    from rich.table import Table

    out = console()
    cells = [_status_cells(r) for r in rows]
    for row in cells:
        row["url"] = row["url"].removeprefix("http://")  # the scheme says nothing here; room does
    widths = {c: max(len(c), *(len(row[c]) for row in cells)) for c in _STATUS_COLUMNS}
    styles = {"state": lambda v: v if v == "running" else f"[yellow]{v}[/]",
              "health": lambda v: {"ok": "[green]ok[/]", "down": "[red]down[/]"}.get(v, v)}
    if sum(widths.values()) + 2 * (len(_STATUS_COLUMNS) - 1) <= out.width:
        table = Table(title="servers", title_justify="left", box=None, padding=(0, 2, 0, 0), pad_edge=False, header_style="bold")
        for column in _STATUS_COLUMNS:
            table.add_column(column, no_wrap=True, min_width=widths[column])
        for row in cells:
            table.add_row(*(styles.get(c, escape)(row[c]) if c in styles else escape(row[c]) for c in _STATUS_COLUMNS))
        out.print(table)
        return
    out.print("[italic]servers[/]")
    for row in cells:
        if len(row["run"]) + 2 + len(row["url"]) <= out.width:
            out.print(f"[bold]{escape(row['run'])}[/]  {escape(row['url'])}", soft_wrap=True, highlight=False)
        else:
            out.print(f"[bold]{escape(row['run'])}[/]", soft_wrap=True, highlight=False)
            out.print(f"  {escape(row['url'])}", soft_wrap=True, highlight=False)
        # Packed by hand into lines: a figure and its label never end up on different lines.
        line: list[tuple[str, str]] = []
        for column in (c for c in _STATUS_COLUMNS if c not in ("run", "url")):
            if line and 2 + sum(len(c) + 1 + len(v) + 3 for c, v in line) + len(column) + 1 + len(row[column]) > out.width:
                _print_status_details(out, line, styles)
                line = []
            line.append((column, row[column]))
        _print_status_details(out, line, styles)


def _print_status_details(out: Any, items: list[tuple[str, str]], styles: dict) -> None:
    from rich.markup import escape

    text = " · ".join(f"{c} {styles[c](v) if c in styles else escape(v)}" for c, v in items)
    out.print("  " + text, soft_wrap=True, highlight=False)


def _utc(iso: str) -> str:
    """A stored ISO time as people read it: 2026-12-01 22:03:15 UTC."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except ValueError:
        return iso


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def logs(
    run: str = typer.Argument(None, help="Run id, id prefix or recipe name (default: the latest run)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until Ctrl-C."),
    lines: int = typer.Option(200, "--lines", "-n", help="How many of the last lines to print first."),
) -> None:
    """Print a server's log."""
    from sparkit.errors import UsageError
    from sparkit.runs import follow_log, list_runs, select_run

    if run is None and not list_runs():
        raise UsageError("no runs yet", hint="start one with `sparkit up`")
    found = select_run(run, include_stopped=True)  # a stopped run's log is worth reading too
    if not found.log_path.exists():
        raise UsageError(f"run {found.id} has no log yet")
    if not found.live:  # whose log this is, when it is not a server that runs now (on stderr: the log stays clean)
        state = found.observed_state().value + (f" {_utc(found.stopped_at)}" if found.stopped_at else "")
        err_console().print(f"{'no server is running; ' if run is None else ''}the log of run {found.id} "
                            f"({found.recipe_name or 'no recipe'}, {state}): {found.log_path}",
                            highlight=False, soft_wrap=True)
    text = found.read_log().splitlines()
    for line in text[-lines:] if lines > 0 else text:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if follow:
        try:
            for line in follow_log(found, from_start=False):
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
        except KeyboardInterrupt:
            # Ctrl-C is how a user ends `logs -f`; it still exits 130 like every command.
            raise


def down(
    run: str = typer.Argument(None, help="Run id, id prefix or recipe name (default: the latest live run)."),
    all_: bool = typer.Option(False, "--all", help="Stop every running server."),
    grace: float = typer.Option(10.0, "--grace", help="Seconds between SIGTERM and SIGKILL."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout (progress and messages on stderr)."),
) -> None:
    """Stop servers (SIGTERM to the process group, SIGKILL after the grace period)."""
    from sparkit.errors import StateError
    from sparkit.runs import live_runs, mark_stale, pid_alive, select_run, stop

    stale = mark_stale()
    if all_ or run is None:
        # Without a RUN, the latest live one; with none running there is nothing to do, which is
        # not a mistake (scripts call `sparkit down` to clean up).
        targets = live_runs()[-1:] if not all_ else live_runs()
    else:
        targets = [select_run(run)]
    unrecorded = []
    for target in targets:
        was_live = target.in_use or target.has_processes
        try:
            stop(target, grace=grace)
        except StateError as exc:  # stopped, but a full disk kept its record from saying so
            unrecorded.append(exc)
            continue
        if was_live:
            err_console().print(f"stopped {target.id}")
            continue
        note = ""
        if pid_alive(target.pid):  # the pid is somebody else's now: never signalled
            note = f"; pid {target.pid} now belongs to another process, which was left alone"
        err_console().print(f"{target.id} was not running (nothing to stop{note})", highlight=False)
    left = [r for r in live_runs() if r.id not in {t.id for t in targets}]
    if json_out:
        print_json({"stopped": [t.id for t in targets], "stale": [s.id for s in stale], "left_running": [r.id for r in left]})
    elif not targets:
        err_console().print("no servers running")
    if left and not json_out:
        names = ", ".join(f"{r.id} ({r.url})" for r in left)
        err_console().print(f"left running: {names}; `sparkit down RUN` stops one, `sparkit down --all` every one",
                            highlight=False, soft_wrap=True)
    if unrecorded:
        raise unrecorded[0]


def check(
    run: str = typer.Argument(None, help="Run id, id prefix or recipe name (default: the latest live run)."),
    url: str = typer.Option(None, "--url", help="Check any live server at this URL instead of a run."),
    recipe: str = typer.Option(None, "--recipe", help="With --url: the recipe whose expectations to check."),
    set_: list[str] = typer.Option([], "--set", help="With --recipe: override a recipe value (repeatable)."),
    api_key: str = typer.Option(None, "--api-key", help="Bearer key to send (default: a run's key, from its recipe's server.api_key_env; else $SPARKIT_API_KEY for a --url server sparkit did not start)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout (progress and messages on stderr)."),
) -> None:
    """Run the activation checks again against a live server."""
    from sparkit.checks.runner import run_activation_checks
    from sparkit.cli.common import require_server
    from sparkit.contract.checks import Status, worst
    from sparkit.contract.plan import LaunchPlan
    from sparkit.errors import CheckFailed, EngineError, UsageError
    from sparkit.runs import resolve_server

    target = resolve_server(run=run, url=url, api_key=api_key)
    if target.run is not None and not target.run.live:
        raise EngineError(
            f"run {target.run.id} is not running",
            hint="`sparkit status` lists the running servers; `sparkit up` starts one",
        )
    if target.run is not None:
        plan = LaunchPlan.load(target.run.plan_path)
        run_path = target.run.path
    elif recipe:
        from sparkit.planning.compile import compile_plan
        from sparkit.recipes.load import load_recipe

        plan = compile_plan(load_recipe(recipe, list(set_)))
        run_path = None
    else:
        raise UsageError("--url needs --recipe RECIPE: the checks compare the server with what a recipe asks for")
    require_server(target.url, target.api_key)  # unreachable: one message, not a table of failed checks
    results = run_activation_checks(target.url, plan, run_path, api_key=target.api_key)
    if json_out:
        print_json({"url": target.url, "run": target.run.id if target.run else None, "checks": [r.to_dict() for r in results]})
    else:
        render_checks(results, title=f"checks of {target.url}")
    if worst(results) == Status.FAIL:
        raise CheckFailed("startup check(s) failed: " + ", ".join(r.title for r in results if r.status == Status.FAIL))


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("status")(status)
    app.command("logs")(logs)
    app.command("down")(down)
    app.command("check")(check)
