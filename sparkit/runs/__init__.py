"""Runs: servers sparkit started, and the pipeline that starts them.

- store: the Run record (typed state) and its directory's files, `select_run` (the one rule
  every command uses to pick a run), `resolve_server` (where requests go).
- processes: the engine's process group (liveness, stopping, reaping).
- launcher: `launch(plan)` and `stop(run)`.
- pipeline: `up(plan)` (preflight, build, launch, wait, startup checks) returning data, and
  `transient_server(plan)`, the same for the length of a `with` block.
"""

from sparkit.runs.launcher import LaunchProgress, free_port, launch, stop
from sparkit.runs.pipeline import Started, preflight, transient_server, up
from sparkit.runs.processes import pid_alive
from sparkit.runs.store import (
    Run,
    RunFiles,
    RunState,
    Server,
    follow_log,
    list_runs,
    live_runs,
    mark_stale,
    prune_runs,
    resolve_server,
    select_run,
)

__all__ = [
    "LaunchProgress", "Run", "RunFiles", "RunState", "Server", "Started", "follow_log", "free_port", "launch",
    "list_runs", "live_runs", "mark_stale", "pid_alive", "preflight", "prune_runs", "resolve_server",
    "select_run", "stop", "transient_server", "up",
]
