"""`sparkit down`: stop servers sparkit started (the latest live one, a named one, or --all)."""

from __future__ import annotations

import typer

from sparkit.cli import options
from sparkit.cli.common import err_console, print_json


def down(
    run: options.ServerRun = None,
    all_: bool = typer.Option(False, "--all", help="Stop every running server."),
    grace: float = typer.Option(10.0, "--grace", metavar="SECONDS", help="Seconds between SIGTERM and SIGKILL."),
    json_out: options.Json = False,
) -> None:
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
