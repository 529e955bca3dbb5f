"""Recipe rules and their violations: a rule has a name, a one-sentence reason and a fix; its
check returns what it finds. The general rules live in sparkit.recipes.rules, each engine's in its
adapter (`rules()`); sparkit.planning.rules runs them together."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["error", "warning"]


@dataclass
class Violation:
    rule: str
    severity: Severity
    key: str  # dotted recipe key the problem is about
    message: str
    reason: str
    fix: str

    def text(self) -> str:
        return f"[{self.rule}] {self.message} ({self.reason})"


@dataclass(frozen=True)
class Rule:
    name: str
    reason: str
    fix: str
    # (a sparkit.recipes.load.LoadedRecipe) -> [(severity, key, message)]; typed Any because the
    # contract sits below the recipes
    check: Callable[[Any], list[tuple[Severity, str, str]]]
