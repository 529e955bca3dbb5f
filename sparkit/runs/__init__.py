"""Runs: servers sparkit started, and the pipeline that starts them.

- store: the Run record (typed state) and its directory's files, `select_run` (the one rule
  every command uses to pick a run), `resolve_server` (where requests go).
- processes: the engine's process group (liveness, stopping, reaping).
- launcher: `launch(plan)` and `stop(run)`.
- pipeline: `up(plan)` (preflight, build, launch, wait, startup checks) returning data, and
  `transient_server(plan)`, the same for the length of a `with` block.
"""

import importlib
from typing import Any

# name -> the module that owns it. Imported on first use (PEP 562), as sparkit/__init__.py does:
# importing one module of the package (runs.processes, from the engines; runs.store, from the
# memory fit) runs this file first, and importing the pipeline here would pull the checks and the
# memory fit into every such import, in a circle.
_EXPORTS = {
    "LaunchProgress": "sparkit.runs.launcher", "free_port": "sparkit.runs.launcher", "launch": "sparkit.runs.launcher",
    "stop": "sparkit.runs.launcher",
    "Started": "sparkit.runs.pipeline", "preflight": "sparkit.runs.pipeline",
    "transient_server": "sparkit.runs.pipeline", "up": "sparkit.runs.pipeline",
    "pid_alive": "sparkit.runs.processes",
    "Run": "sparkit.runs.store", "RunFiles": "sparkit.runs.store", "RunState": "sparkit.runs.store",
    "Server": "sparkit.runs.store", "follow_log": "sparkit.runs.store", "list_runs": "sparkit.runs.store",
    "live_runs": "sparkit.runs.store", "mark_stale": "sparkit.runs.store", "prune_runs": "sparkit.runs.store",
    "resolve_server": "sparkit.runs.store", "select_run": "sparkit.runs.store", "run_serving": "sparkit.runs.store",
    "holder_of_port": "sparkit.runs.store",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sparkit.runs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(globals()))
