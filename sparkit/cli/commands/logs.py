"""`sparkit logs`: a run's server log, its last lines and (-f) as it grows."""

from __future__ import annotations

import sys
from datetime import UTC

import typer

from sparkit.cli.common import err_console


def _utc(iso: str) -> str:
    """A stored ISO time as people read it: 2026-12-01 22:03:15 UTC."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except ValueError:
        return iso


def logs(
    run: str | None = typer.Argument(None, help="Run id, id prefix or recipe name (default: the latest run)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until Ctrl-C."),
    lines: int = typer.Option(200, "--lines", "-n", help="How many of the last lines to print first."),
) -> None:
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
