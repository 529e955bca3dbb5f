"""Evidence of what a live server runs, as the activation checks read it: its /server_info body,
its log (read by the engine's own log reader: sparkit.engines.sglang.log), the activation
reports written from inside the engine, a short greedy probe and the known-answer score, gathered
into one ServerEvidence by sparkit.checks.runner. Pure data -> data.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from sparkit.checks.known_answer import KnownAnswerScore
from sparkit.contract.log import LogEvidence
from sparkit.engines.activation_report import ActivationReport


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


@dataclass
class ProbeRequest:
    prompt: str
    completion_tokens: int
    spec_verify_ct: int | None
    decode_tok_s: float | None
    latency_s: float


@dataclass
class ProbeResult:
    """A few short greedy /generate requests: the measured accept length and decode speed."""

    requests: list[ProbeRequest] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        """What to_dict() wrote (probe.json in a run directory); derived figures are recomputed."""
        names = {f.name for f in fields(ProbeRequest)}
        return cls(requests=[ProbeRequest(**{k: v for k, v in r.items() if k in names}) for r in data.get("requests", [])],
                   error=data.get("error"))

    @property
    def completion_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.requests)

    @property
    def spec_verify_ct(self) -> int | None:
        counts = [r.spec_verify_ct for r in self.requests if r.spec_verify_ct]
        return sum(counts) if counts else None

    @property
    def accept_length(self) -> float | None:
        """completion_tokens / spec_verify_ct over the requests that speculated."""
        spec = [r for r in self.requests if r.spec_verify_ct]
        if not spec:
            return None
        return sum(r.completion_tokens for r in spec) / sum(r.spec_verify_ct for r in spec)  # type: ignore[misc]

    @property
    def decode_tok_s(self) -> float | None:
        """Median per-request decode speed (excluding TTFT)."""
        values = sorted(r.decode_tok_s for r in self.requests if r.decode_tok_s)
        if not values:
            return None
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": [vars(r) for r in self.requests],
            "completion_tokens": self.completion_tokens,
            "spec_verify_ct": self.spec_verify_ct,
            "accept_length": self.accept_length,
            "decode_tok_s": self.decode_tok_s,
            "error": self.error,
        }


@dataclass
class ServerEvidence:
    """Everything the checks may look at. Any part may be missing (None / empty)."""

    engine: str
    server_info: ServerInfo | None = None
    log: LogEvidence | None = None
    reports: list[ActivationReport] = field(default_factory=list)
    probe: ProbeResult | None = None
    server_info_error: str | None = None
    known_answer: KnownAnswerScore | None = None  # the reference text scored (when the plan states a value)
    # The engine process's environment as the OS reports it (None: not read: no run, not running, no /proc)
    engine_environ: dict[str, str] | None = None

    @property
    def args(self) -> dict[str, Any] | None:
        if self.server_info is not None:
            return self.server_info.args
        if self.log is not None and self.log.server_args:
            return self.log.server_args
        return None

    @property
    def report(self) -> ActivationReport | None:
        """Rank 0's report (what every rank shares: model classes, MoE, speculative settings)."""
        return self.reports[0] if self.reports else None

    def missing_ranks(self) -> list[int]:
        """TP ranks that wrote no report, from the ranks' own tp_size (empty when none wrote)."""
        if not self.reports:
            return []
        size = max(r.tp_size for r in self.reports)
        have = {r.tp_rank for r in self.reports}
        return [rank for rank in range(size) if rank not in have]
