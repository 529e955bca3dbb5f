"""`sparkit status`: the servers sparkit started, with their health and startup-probe figures: a
table on a terminal, one aligned line per run piped, or --json."""

from __future__ import annotations

import sys
from typing import Any

import typer

from sparkit.cli import options
from sparkit.cli.common import console, err_console, is_terminal, print_json


def status(
    json_out: options.Json = False,
    all_: bool = typer.Option(False, "--all", "-a", help="Also list stopped and failed runs."),
    prune: bool = typer.Option(False, "--prune", help="Delete the directories of runs that are not running."),
) -> None:
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


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")
