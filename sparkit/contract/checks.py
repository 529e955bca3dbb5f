"""CheckResult: the one shape every check returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"  # not applicable to this plan (e.g. acceptance without speculation)


@dataclass
class CheckResult:
    name: str  # stable id, e.g. "lm_head_dtype"
    title: str  # human name, e.g. "lm_head dtype"
    status: Status
    detail: str  # one sentence: what was found
    evidence: list[str] = field(default_factory=list)  # where it was seen (log line, report field, value)
    fix: str | None = None  # how to fix it, when not passing
    cause: str | None = None  # why it matters / likely cause, when not passing
    data: dict[str, Any] = field(default_factory=dict)  # measured values for --json (e.g. accept_length)

    @property
    def ok(self) -> bool:
        return self.status in (Status.PASS, Status.SKIP, Status.WARN)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckResult:
        data = dict(data)
        data["status"] = Status(data["status"])
        return cls(**data)


def worst(results: list[CheckResult]) -> Status:
    order = [Status.SKIP, Status.PASS, Status.WARN, Status.FAIL]
    return max((r.status for r in results), key=order.index, default=Status.PASS)
