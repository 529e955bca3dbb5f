"""The `up` pipeline as a library function: preflight, build, launch, wait, startup checks.

`up()` returns data (`Started`) and never prints; the CLI renders it, and `tune` and `verify` start
their transient servers through `transient_server()`, the same pipeline as a context manager that
stops the server however the block ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sparkit import interrupts
from sparkit.checks.preflight import gpus_check, run_preflight
from sparkit.checks.runner import run_activation_checks
from sparkit.contract.checks import CheckResult, Status, worst
from sparkit.contract.plan import LaunchPlan
from sparkit.errors import PreflightError, StateError
from sparkit.host import detect_host
from sparkit.runs.launcher import ProgressFn, launch, stop
from sparkit.runs.store import CHECKING, Run, RunState, Server, launch_lock

# Called with the preflight results before anything starts (the CLI shows them there).
PreflightFn = Callable[[list[CheckResult]], None]


@dataclass
class Started:
    """A server `up` started: its run, what preflight found, what the startup checks found."""

    run: Run
    plan: LaunchPlan
    preflight: list[CheckResult]
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return worst(self.checks) is not Status.FAIL if self.checks else True

    @property
    def failed_checks(self) -> list[CheckResult]:
        return [r for r in self.checks if r.status is Status.FAIL]

    @property
    def server(self) -> Server:
        return Server(self.plan.url, self.run.api_key, self.run)


def preflight(plan: LaunchPlan) -> list[CheckResult]:
    """Every preflight check of `plan` on this host; raises PreflightError (exit 4) on a failure."""
    results = run_preflight(plan, detect_host())
    _raise_on_failure(results)
    return results


def host_preflight(recipe) -> list[CheckResult]:
    """The part of preflight a loaded recipe answers before it is compiled (its target's GPUs on
    this host); raises PreflightError (exit 4) on a failure, with the results on the error."""
    results = [gpus_check(recipe.target, recipe.engine, recipe.stack.tp, detect_host())]
    _raise_on_failure(results)
    return results


def _raise_on_failure(results: list[CheckResult]) -> None:
    failed = [r for r in results if r.status is Status.FAIL]
    if failed:
        error = PreflightError("preflight failed: " + "; ".join(f"{r.title}: {r.detail}" for r in failed),
                               hint=next((r.fix for r in failed if r.fix), None))
        error.results = results  # type: ignore[attr-defined]
        raise error


def up(plan: LaunchPlan, *, timeout: float = 600, detach: bool = True, checks: bool = True,
       on_preflight: PreflightFn | None = None, on_progress: ProgressFn | None = None,
       on_checking: Callable[[Run], None] | None = None, tie_to_parent: bool | None = None,
       under_lock: Callable[[], None] | None = None) -> Started:
    """Preflight, then launch (builds included) and wait, then the startup checks.

    Raises PreflightError before anything starts, LaunchError when the engine does not come up
    (nothing left running). Failed startup checks are data (`Started.ok`): the caller decides
    whether the server stays. Ctrl-C during the checks stops the server. `detach` and
    `tie_to_parent`: see launch(). `under_lock` is called with the launch lock held, before the
    preflight: the caller's last word on whether to start, against the runs recorded by then
    (`sparkit up` refuses there to duplicate a run another `up` began a moment before)."""
    # Preflight and the run record under one lock: a second `up` started at the same moment waits
    # here, then sees this run starting and reserves the memory it will take.
    try:
        interrupts.raise_if_pending()  # one the interpreter swallowed before this start
        with launch_lock() as release:
            if under_lock is not None:
                under_lock()
            found = preflight(plan) if on_preflight is None else _preflight_shown(plan, on_preflight)
            interrupts.raise_if_pending()  # ... or during the preflight (a child process, a finaliser)
            run = launch(plan, on_progress=on_progress, timeout=timeout, detach=detach, tie_to_parent=tie_to_parent,
                         memory_fit=_memory_record(plan, found), on_recorded=lambda _run: release())
    except KeyboardInterrupt:
        interrupts.clear()  # it is on its way to the caller: a later start begins clean
        raise
    started = Started(run, plan, found)
    if not checks:
        return started
    try:
        interrupts.raise_if_pending()
        run = started.run = _set_phase(run, CHECKING)
        if on_checking is not None:
            on_checking(run)
        started.checks = run_activation_checks(plan.url, plan, run.path, api_key=run.api_key)
        interrupts.raise_if_pending()
    except BaseException as exc:
        _failed_during_checks(run, exc)
        raise
    started.run = _set_phase(run, None)
    return started


def _failed_during_checks(run: Run, exc: BaseException) -> None:
    """Interrupted (Ctrl-C, SIGTERM, SIGHUP) or broken during the checks: the start did not finish,
    the record says so (a SIGKILL of up is found later: Run.unfinished_start), and the engine is
    stopped, whatever signal comes meanwhile."""
    why = ("interrupted during the startup checks" if isinstance(exc, KeyboardInterrupt)
           else f"the startup checks could not run: {exc}".splitlines()[0][:200])
    with interrupts.deferred():
        try:
            failed = run.reload()
            failed.state, failed.failure, failed.phase = RunState.FAILED, why, None
            failed.save()
        except (OSError, ValueError, TypeError, StateError):
            pass
        stop(run)
    if isinstance(exc, KeyboardInterrupt):
        interrupts.clear()


def _set_phase(run: Run, phase: str | None) -> Run:
    run = run.reload()
    run.phase = phase
    run.save()
    return run


def _memory_record(plan: LaunchPlan, found: list[CheckResult]) -> dict | None:
    """What the run will hold, from preflight's memory fit, with the GPUs it runs on."""
    fit = next((r.data for r in found if r.name == "memory" and r.data), None)
    if not fit:
        return None
    tp = int((plan.recipe.get("stack") or {}).get("tp", 1) or 1)
    return {**fit, "gpus": list(range(tp))}


def _preflight_shown(plan: LaunchPlan, shown: PreflightFn) -> list[CheckResult]:
    try:
        results = preflight(plan)
    except PreflightError as exc:
        shown(exc.results)  # type: ignore[attr-defined]
        raise
    shown(results)
    return results


@contextlib.contextmanager
def transient_server(plan: LaunchPlan, *, timeout: float = 600, checks: bool = False,
                     on_progress: ProgressFn | None = None) -> Iterator[Started]:
    """`up` for the length of a block (tune, verify, ladder): the server is stopped however the
    block ends, an exception or a signal included (and a second signal does not cut the stop
    short). It is held by this process as a foreground `up` holds its server: tied to it (the
    kernel ends it with this process, SIGKILL included), and recorded so, so that a command that
    finds its holder gone records what became of it (sparkit.runs.store.mark_stale)."""
    started = up(plan, timeout=timeout, detach=False, checks=checks, on_progress=on_progress, tie_to_parent=True)
    try:
        yield started
    finally:
        with interrupts.deferred():
            stop(started.run)
        interrupts.raise_if_pending()  # a signal during the stop, once the server is gone
