"""The contract: the plain types every layer of sparkit speaks, on the ground floor.

    plan      LaunchPlan, Expectations, Provision   what a recipe compiles to (plan.json)
    engine    EngineAdapter, EngineLaunch, EngineInfo, STARTUP_PHASES, engine_names
    environment  EngineEnvironment, EnvFamily            what a recipe's server.env may set
    rules     Rule, Violation, Severity             recipe rules, general and each engine's
    reading   ReadRules, DTYPE_BYTES                how an engine reads a checkpoint per step
    log       LogEvidence, Diagnosis, ...           what an engine's startup log proves
    checks    CheckResult, Status                   what every check returns

It imports nothing of sparkit's but itself, so any layer may import it and it can import none of
them (tests/test_import_graph.py holds the layers to that)."""

from __future__ import annotations

from sparkit.contract.checks import CheckResult, Status, worst
from sparkit.contract.engine import (
    BUILTIN_ENGINES,
    ENTRY_POINT_GROUP,
    STARTUP_PHASES,
    EngineAdapter,
    EngineInfo,
    EngineLaunch,
    engine_names,
    engine_specs,
)
from sparkit.contract.log import DecodeStat, Diagnosis, LogEvidence, WeightLoad
from sparkit.contract.plan import Expectations, LaunchPlan, Provision
from sparkit.contract.reading import DTYPE_BYTES, ReadRules
from sparkit.contract.rules import Rule, Severity, Violation

__all__ = [
    "BUILTIN_ENGINES", "CheckResult", "DTYPE_BYTES", "DecodeStat", "Diagnosis", "ENTRY_POINT_GROUP", "EngineAdapter",
    "EngineInfo", "EngineLaunch", "Expectations", "LaunchPlan", "LogEvidence", "Provision", "ReadRules", "Rule",
    "STARTUP_PHASES", "Severity", "Status", "Violation", "WeightLoad", "engine_names", "engine_specs", "worst",
]
