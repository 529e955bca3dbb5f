"""LaunchPlan: the exact engine launch a recipe compiles to.

This is the contract between the planner (sparkit.planning), the process
lifecycle (sparkit.runs) and the startup checks (sparkit.checks). It is plain
data, serialised as plan.json in each run directory.
"""

from __future__ import annotations

import copy
import json
import shlex
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any


@dataclass
class Provision:
    """Which path provides one optimisation, e.g. lm_head fp8 via 'sparkit-plugin'."""

    optimisation: str  # "lm_head=fp8", "moe_backend=humming", "speculative=nextn", ...
    provider: str  # "sglang-flag", "sglang-env", "sparkit-plugin", "embedded", "checkpoint"
    detail: str  # the flag / env var / module that does it


@dataclass
class Expectations:
    """What the startup checks will verify on the live server. None = not asserted."""

    weights: str | None = None  # bf16 | fp8 | mxfp4
    moe_backend: str | None = None  # as requested (may be "auto"): what every MoE layer must run
    lm_head: str | None = None  # bf16 | fp32 | fp8
    # fp8 heads: exact re-scoring candidates per row the activation report must show (None: not asserted)
    lm_head_exact_top_k: int | None = None
    speculative: str | None = None  # None | "nextn" | "dspark"
    draft_model: str | None = None
    draft_shares_lm_head: bool | None = None
    draft_shares_embedding: bool | None = None  # DSpark: the draft embeds with the target's module
    block_size: int | None = None  # DSpark: the recipe's stack.speculative.block_size (None: the draft's)
    draft_block_size: int | None = None  # DSpark: the draft config's block_size, read at plan time
    min_accept_length: float | None = None
    min_decode_tok_s: float | None = None
    # the known-answer check (sparkit.checks.known_answer): stated perplexity and relative tolerance
    reference_perplexity: float | None = None
    reference_perplexity_tolerance: float | None = None
    reference_model_note: str | None = None  # model.path set after the reference was stated: where each came from
    # The resolved args (SGLang ServerArgs names) the server must report, and their values: the one
    # statement of each setting's expected value (sparkit.contract.flag_table's rows), in the order
    # the resolved-args check lists them.
    server_args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Expectations:
        """From plan.json, including one written before the resolved args were stated once: its
        separate fields for them are folded into server_args where that check reads them."""
        data = dict(data)
        legacy = {dest: data.pop(name) for name, dest in _LEGACY_RESOLVED.items() if name in data}
        reported = data.pop("speculative_algorithm_reported", None)
        if legacy or reported is not None:
            legacy.setdefault("moe_runner_backend", data.get("moe_backend"))
            if reported or data.get("speculative"):
                legacy["speculative_algorithm"] = reported or str(data["speculative"]).upper()
            data["server_args"] = {**{k: v for k, v in legacy.items() if v is not None}, **(data.get("server_args") or {})}
        return cls(**data)


# plan.json's Expectations fields for resolved args before server_args held them all, and the
# resolved-args names they were checked under (a record of that format: it does not change).
_LEGACY_RESOLVED = {"num_steps": "speculative_num_steps", "eagle_topk": "speculative_eagle_topk",
                    "num_draft_tokens": "speculative_num_draft_tokens", "tp": "tp_size", "ep": "ep_size",
                    "attention_backend": "attention_backend", "mem_fraction_static": "mem_fraction_static"}


@dataclass
class LaunchPlan:
    engine: str  # a name in sparkit.contract.engine.engine_names()
    argv: list[str]  # argv[0] is the executable (sys.executable for python -m ...)
    env: dict[str, str]  # only the variables sparkit sets (merged over os.environ at start)
    host: str
    port: int
    model: str  # path, hub id, or "sparkit:tiny-ling" for the built-in tiny model
    served_model_name: str
    recipe_name: str
    recipe_path: str | None
    expectations: Expectations
    provisions: list[Provision] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Built-in models to build (and export) before launch (sparkit.engines.builtin_models),
    # e.g. {"name": "tiny-ling", "seed": 0, "dir": "..."}.
    model_builds: list[dict[str, Any]] = field(default_factory=list)
    # Hub models the engine loads (sparkit.hub.cache.plan_hub_model): {"key", "role", "ref", "repo",
    # "revision", "commit", "local" (the snapshot the argv names, None until `sparkit pull`), "state",
    # "detail"}. The engine never downloads: a launch with one not here is refused.
    model_pulls: list[dict[str, Any]] = field(default_factory=list)
    # Environment variable that carries the API key, when the recipe sets one (never the secret).
    api_key_env: str | None = None
    recipe: dict[str, Any] = field(default_factory=dict)  # the fully resolved recipe, for the record
    # What checked the argv and env against the engine that will run them (None: nothing could,
    # and validation_note says why and how to get it).
    validated_by: str | None = None
    validation_note: str | None = None
    # The variables of the recipe's server.env outside the engine's settings that its
    # server.allow_code_env lets in (sparkit.contract.environment), each with what it can load.
    code_env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    def command_line(self) -> str:
        """Shell-quoted, ready to paste: env assignments then argv."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = shlex.join(self.argv)
        return f"{env} {cmd}" if env else cmd

    def to_dict(self) -> dict[str, Any]:
        # asdict() deep-copies field by field in Python; a recipe may set thousands of variables,
        # and its plain-data parts copy faster through the C JSON codec.
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("env", "recipe"):  # plain JSON data (strings; the recipe's model_dump)
                value = json.loads(json.dumps(value))
            elif f.name == "expectations":
                value = asdict(value)
            elif f.name == "provisions":
                value = [asdict(p) for p in value]
            else:
                value = copy.deepcopy(value)
            out[f.name] = value
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchPlan:
        data = dict(data)
        data["expectations"] = Expectations.from_dict(data.get("expectations", {}))
        data["provisions"] = [Provision(**p) for p in data.get("provisions", [])]
        return cls(**data)

    @classmethod
    def load(cls, path: Path) -> LaunchPlan:
        return cls.from_dict(json.loads(Path(path).read_text()))
