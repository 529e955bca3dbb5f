"""Run the activation checks against a live server.

Gathers the evidence (GET /server_info, the run directory's server.log and
activation reports, a short greedy probe through /generate) with
sparkit.client, then evaluates sparkit.checks.activation on it. When a run
directory is given, the results go to checks.json and the probe to probe.json,
so that `sparkit status` can show the last measured tok/s and accept length.
"""

from __future__ import annotations

import asyncio
from datetime import UTC
from pathlib import Path

from sparkit.checks.activation import evaluate
from sparkit.checks.evidence import ProbeRequest, ProbeResult, ServerEvidence, parse_server_info
from sparkit.checks.known_answer import score_reference
from sparkit.client import EngineClient, Generation
from sparkit.contract.checks import CheckResult, Status
from sparkit.contract.plan import LaunchPlan
from sparkit.engines.activation_report import load_reports
from sparkit.engines.base import get_adapter
from sparkit.errors import EngineError, StateError
from sparkit.paths import open_state
from sparkit.runs.processes import process_environ
from sparkit.runs.store import Run, RunFiles, write_json_atomic

# Short, varied, natural prompts: a draft that shares the target's head accepts
# well on them; a useless draft sits at ~1.0 whatever the prompt.
PROBE_PROMPTS = (
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Once upon a time, in a small village by the sea, there lived",
    "1, 2, 3, 4, 5, 6, 7, 8,",
)
PROBE_MAX_NEW_TOKENS = 48


async def probe_generation(
    url: str,
    *,
    api_key: str | None = None,
    prompts: tuple[str, ...] = PROBE_PROMPTS,
    max_new_tokens: int = PROBE_MAX_NEW_TOKENS,
    timeout: float = 300.0,
) -> ProbeResult:
    """A few short greedy streamed /generate requests, one at a time (batch 1)."""
    result = ProbeResult()
    params = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    try:
        async with EngineClient(url, api_key=api_key, timeout=timeout) as client:
            for prompt in prompts:
                final: Generation | None = None
                async for item in client.stream_generate(prompt, sampling_params=params):
                    if isinstance(item, Generation):
                        final = item
                if final is None:
                    continue
                verify = final.spec_verify_ct
                if not verify and final.accept_length and final.completion_tokens:
                    # Only spec_accept_length in meta_info: recover the verify count it came from.
                    verify = max(1, round(final.completion_tokens / final.accept_length))
                result.requests.append(
                    ProbeRequest(
                        prompt=prompt,
                        completion_tokens=final.completion_tokens,
                        spec_verify_ct=int(verify) if verify else None,
                        decode_tok_s=final.decode_tok_s,
                        latency_s=final.latency,
                    )
                )
    except EngineError as exc:
        result.error = exc.message
    return result


async def gather_evidence(
    url: str,
    plan: LaunchPlan,
    run_dir: Path | None = None,
    api_key: str | None = None,
    *,
    probe: bool = True,
) -> ServerEvidence:
    ev = ServerEvidence(engine=plan.engine)
    try:
        async with EngineClient(url, api_key=api_key, timeout=30.0) as client:
            ev.server_info = parse_server_info(await client.server_info())
    except EngineError as exc:
        ev.server_info_error = exc.message
    if probe:
        ev.probe = await probe_generation(url, api_key=api_key)
        if plan.expectations.reference_perplexity is not None:
            ev.known_answer = await score_reference(url, api_key=api_key)
    if run_dir is not None:
        run_dir = Path(run_dir)
        log_path = run_dir / RunFiles.LOG
        if log_path.exists():
            # Read after the probe: decode lines and humming's first-use line appear then.

            with open_state(log_path, "r", errors="replace") as handle:
                ev.log = get_adapter(plan.engine).read_log(handle.read())
        try:
            ev.reports = load_reports(run_dir)
        except (ValueError, KeyError, TypeError, OSError):
            ev.reports = []
        ev.engine_environ = _engine_environ(run_dir)
    return ev


def _engine_environ(run_dir: Path) -> dict[str, str] | None:
    """The environment of the run's engine process, while it is the process sparkit started."""
    try:
        run = Run.open(run_dir)
    except (OSError, ValueError, TypeError, StateError):
        return None
    return process_environ(run.pid) if run.live else None


async def arun_activation_checks(
    url: str,
    plan: LaunchPlan,
    run_dir: Path | None = None,
    api_key: str | None = None,
) -> list[CheckResult]:
    ev = await gather_evidence(url, plan, run_dir, api_key)
    results = evaluate(plan, ev)
    if run_dir is not None:
        try:
            _record(Path(run_dir), results, ev)
        except StateError as exc:  # a full disk: the results are still shown, and the failure with them
            results.append(CheckResult("results_saved", "results saved", Status.WARN,
                                       f"{exc.message}; `sparkit status` shows the previous results", fix=exc.hint))
    return results


def run_activation_checks(
    url: str,
    plan: LaunchPlan,
    run_dir: Path | None = None,
    api_key: str | None = None,
) -> list[CheckResult]:
    """The activation checks against a live server (blocking; do not call from a running loop)."""
    return asyncio.run(arun_activation_checks(url, plan, run_dir, api_key))


def _record(run_dir: Path, results: list[CheckResult], ev: ServerEvidence) -> None:
    from datetime import datetime

    now = datetime.now(UTC).isoformat()
    write_json_atomic(run_dir / RunFiles.CHECKS, {"checked_at": now, "results": [r.to_dict() for r in results]})
    if ev.probe is not None:
        write_json_atomic(run_dir / RunFiles.PROBE, {"measured_at": now, **ev.probe.to_dict()})

