"""What the side panel says about the server: its recipe and its startup checks.

Connected to a run (`sparkit chat RUN`), the recipe and the check results come
from the run directory (plan.json, meta.json, checks.json). Connected by --url,
they come from /server_info (resolved args, avg_spec_accept_length).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkit.engines.base import shown_args


@dataclass
class CheckLine:
    name: str
    status: str  # pass | warn | fail | skip
    detail: str = ""


@dataclass
class ServerSummary:
    source: str  # "run <id>" or "/server_info"
    recipe: str | None = None
    facts: list[tuple[str, str]] = field(default_factory=list)
    checks: list[CheckLine] = field(default_factory=list)
    checks_note: str | None = None  # why there are no checks to show


def _check_entries(raw: Any) -> list[dict[str, Any]]:
    """checks.json is a list of CheckResult dicts, or an object holding one."""
    if isinstance(raw, list):
        return [c for c in raw if isinstance(c, dict)]
    if isinstance(raw, dict):
        for key in ("results", "checks"):
            if isinstance(raw.get(key), list):
                return [c for c in raw[key] if isinstance(c, dict)]
    return []


def summarize_run(run: Any) -> ServerSummary:
    """Summary from a sparkit.runs.Run."""
    from sparkit.runs.store import RunFiles

    plan = run.read_json(RunFiles.PLAN) or {}
    meta = run.read_json(RunFiles.META) or {}
    summary = ServerSummary(source=f"run {run.id}", recipe=plan.get("recipe_name") or meta.get("recipe_name"))
    if plan.get("served_model_name"):
        summary.facts.append(("served as", str(plan["served_model_name"])))
    if plan.get("engine") or meta.get("engine"):
        summary.facts.append(("engine", str(plan.get("engine") or meta.get("engine"))))
    for provision in plan.get("provisions") or []:
        if isinstance(provision, dict) and provision.get("optimisation"):
            summary.facts.append(("provides", str(provision["optimisation"])))
    raw = run.read_json(RunFiles.CHECKS)
    if raw is None:
        summary.checks_note = "no startup checks recorded (checks.json missing)"
    for entry in _check_entries(raw):
        summary.checks.append(
            CheckLine(
                name=str(entry.get("title") or entry.get("name") or "?"),
                status=str(entry.get("status", "?")),
                detail=str(entry.get("detail") or ""),
            )
        )
    return summary


def summarize_server_info(info: dict[str, Any]) -> ServerSummary:
    """Summary from /server_info: the resolved args; no startup checks exist without a run."""
    summary = ServerSummary(source="/server_info", recipe=info.get("recipe_name") or info.get("sparkit_recipe"))
    for key, label in shown_args().items():
        value = info.get(key)
        if value is None or value == "" or value is False:
            continue
        summary.facts.append((label, str(value)))
    for state in info.get("internal_states") or []:
        if isinstance(state, dict) and state.get("avg_spec_accept_length") is not None:
            summary.facts.append(("server accept", f"{float(state['avg_spec_accept_length']):.2f}"))
            break
    if info.get("version"):
        summary.facts.append(("version", str(info["version"])))
    summary.checks_note = "no startup checks: not started by sparkit (connect to a run to see them)"
    return summary


def merge(run_summary: ServerSummary | None, info_summary: ServerSummary | None) -> ServerSummary | None:
    """A run's checks and recipe, plus the live args the server reports."""
    if run_summary is None:
        return info_summary
    if info_summary is None:
        return run_summary
    seen = {label for label, _ in run_summary.facts}
    run_summary.facts.extend((label, value) for label, value in info_summary.facts if label not in seen)
    return run_summary
