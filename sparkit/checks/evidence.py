"""Evidence of what a live server runs, from its /server_info body (the log's evidence is read by
the engine's own log reader: sparkit.engines.sglang.log). Pure data -> data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ServerInfo:
    """The parts of a /server_info body the checks read."""

    args: dict[str, Any]  # every resolved ServerArgs field
    version: str | None = None
    launch_command: str | None = None
    avg_spec_accept_length: float | None = None  # from internal_states[], once speculation ran
    raw: dict[str, Any] = field(default_factory=dict)


_NOT_ARGS = {"internal_states", "version", "launch_command", "startup_time", "frontend", "kv_events"}


def parse_server_info(body: dict[str, Any]) -> ServerInfo:
    args = {k: v for k, v in body.items() if k not in _NOT_ARGS}
    accepts = []
    for state in body.get("internal_states") or []:
        if isinstance(state, dict) and state.get("avg_spec_accept_length") is not None:
            try:
                accepts.append(float(state["avg_spec_accept_length"]))
            except (TypeError, ValueError):
                pass
    launch = body.get("launch_command")
    if isinstance(launch, list):
        launch = " ".join(str(x) for x in launch)
    return ServerInfo(
        args=args,
        version=body.get("version"),
        launch_command=launch,
        avg_spec_accept_length=sum(accepts) / len(accepts) if accepts else None,
        raw=body,
    )
