"""`sparkit tune --param`: what a sweep can vary, and the --set assignments each point becomes.

Three kinds of parameter, each `--param` one of them:

- a recipe key, `KEY=V1,V2,...` (values read as YAML, as `--set` reads them); a stack key may leave
  out its section: `speculative.num_steps=1,2,3` is `stack.speculative.num_steps` (the schema's
  fields say which keys are the stack's, so a field added later is reached the same way);
- an environment variable of the engine, `env.NAME=V1,V2,...`: `server.env.NAME`, each value
  verbatim (`env.SGLANG_ENABLE_METADATA_GLUE_GRAPH=0,1`);
- an engine flag, `flag.--name=V1,V2,...`: the recipe's `server.extra_args` with `--name V` (an
  occurrence of the flag already there replaced), or a bare `flag.--name`: two points, the flag not
  passed (`off`) and passed (`on`).

The engine's own parser judges each flag when the points are planned, before any server starts.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from typing import Any

from sparkit.contract.flag_table import chain_draft_tokens
from sparkit.errors import UsageError
from sparkit.recipes.schema import Recipe, Stack

ENV_PREFIX = "env."
FLAG_PREFIX = "flag."
FLAG_OFF, FLAG_ON = "off", "on"  # a bare flag's two points
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FLAG = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9_-]*$")
EXAMPLES = "e.g. --param speculative.num_steps=1,2,3,4, --param env.SGLANG_X=0,1 or --param flag.--some-switch"


@dataclass
class SweepParam:
    key: str  # as given: speculative.num_steps, env.SGLANG_X, flag.--y
    values: list[str]
    kind: str = "recipe"  # recipe | env | flag
    bare: bool = False  # a flag given without values: off and on

    @property
    def name(self) -> str:
        """The recipe key, the variable or the flag the parameter sets."""
        if self.kind == "env":
            return self.key.removeprefix(ENV_PREFIX)
        if self.kind == "flag":
            return self.key.removeprefix(FLAG_PREFIX)
        return recipe_key(self.key)


def recipe_key(key: str) -> str:
    """Accept a stack key without its section (`speculative.num_steps` for
    `stack.speculative.num_steps`), as the schema's fields say."""
    head = key.split(".", 1)[0]
    if head not in Recipe.model_fields and head in Stack.model_fields:
        return f"stack.{key}"
    return key


def parse_param(spec: str) -> SweepParam:
    """One `--param`: a recipe key, `env.NAME` or `flag.--name`, with its values (a bare flag: off, on)."""
    key, sep, raw = spec.partition("=")
    key = key.strip()
    values = [v.strip() for v in raw.split(",") if v.strip()]
    if key.startswith(FLAG_PREFIX):
        flag = key.removeprefix(FLAG_PREFIX)
        if not _FLAG.match(flag):
            raise UsageError(f"--param {spec!r}: {flag!r} is not a flag (flag.--name, the flag spelt out with its two "
                             "dashes)", hint=EXAMPLES)
        if not sep:
            return SweepParam(key, [FLAG_OFF, FLAG_ON], "flag", bare=True)
        if not values:
            raise UsageError(f"--param {spec!r}: give the flag's values (flag.--name=V1,V2) or none for off and on",
                             hint=EXAMPLES)
        return SweepParam(key, values, "flag")
    if not sep or not key or not values:
        raise UsageError(f"--param {spec!r}: expected KEY=VALUE[,VALUE...]", hint=EXAMPLES)
    if key.startswith(ENV_PREFIX):
        name = key.removeprefix(ENV_PREFIX)
        if not _ENV_NAME.match(name):
            raise UsageError(f"--param {spec!r}: {name!r} is not an environment variable name", hint=EXAMPLES)
        return SweepParam(key, values, "env")
    return SweepParam(key, values)


def parse_params(specs: list[str]) -> list[SweepParam]:
    """`--param` strings to parameters, each set once."""
    if not specs:
        raise UsageError("tune needs at least one --param", hint=EXAMPLES)
    params: list[SweepParam] = []
    for spec in specs:
        param = parse_param(spec)
        if any(p.key == param.key or (p.kind == param.kind and p.name == param.name) for p in params):
            raise UsageError(f"--param {param.key!r} is given twice")
        params.append(param)
    return params


def grid(params: list[SweepParam]) -> list[dict[str, str]]:
    """Every combination of the parameters' values, the first value of each first."""
    return [dict(zip([p.key for p in params], combo)) for combo in itertools.product(*(p.values for p in params))]


def point_label(point: dict[str, str]) -> str:
    return ",".join(f"{_short(k)}={v}" for k, v in point.items())


def _short(key: str) -> str:
    if key.startswith(FLAG_PREFIX):
        return key.removeprefix(FLAG_PREFIX)
    return key.rsplit(".", 1)[-1]


def overrides_for(point: dict[str, str], base_recipe: Any, params: list[SweepParam] | None = None) -> list[str]:
    """--set assignments for one point. Sweeping NEXTN num_steps implies the method and,
    for a chain (eagle_topk 1), num_draft_tokens = num_steps + 1, unless swept too. Environment
    values are set verbatim; flags replace their occurrence in the recipe's server.extra_args."""
    kinds = {p.key: p for p in params or []}
    sets: dict[str, str] = {}
    extra: list[str] | None = None
    for key, value in point.items():
        param = kinds.get(key) or parse_param(f"{key}={value}")
        if param.kind == "env":
            sets[f"server.env.{param.name}"] = json.dumps(value)
        elif param.kind == "flag":
            if extra is None:
                extra = list(getattr(getattr(base_recipe, "server", None), "extra_args", None) or [])
            extra = with_flag(extra, param.name, None if param.bare else value, on=not param.bare or value == FLAG_ON)
        else:
            sets[recipe_key(key)] = value
    _speculative_implied(sets, base_recipe)
    if extra is not None:
        sets["server.extra_args"] = json.dumps(extra)
    return [f"{k}={v}" for k, v in sets.items()]


def with_flag(args: list[str], flag: str, value: str | None, *, on: bool = True) -> list[str]:
    """`args` with `flag` set to `value` (None: a bare switch, passed when `on`), replacing what
    `args` says of it (`--flag`, `--flag V`, `--flag=V`)."""
    out: list[str] = []
    skip_value = False
    for item in args:
        if skip_value:
            skip_value = False
            if not item.startswith("--"):
                continue
        if item == flag:
            skip_value = value is not None  # the occurrence's own value goes with it
            continue
        if item.startswith(flag + "="):
            continue
        out.append(item)
    if value is not None:
        return out + [flag, value]
    return out + [flag] if on else out


def _speculative_implied(sets: dict[str, str], base_recipe: Any) -> None:
    steps_key = "stack.speculative.num_steps"
    if steps_key not in sets:
        return
    spec = getattr(getattr(base_recipe, "stack", None), "speculative", None)
    method = getattr(spec, "method", "none")
    if method == "none" and "stack.speculative.method" not in sets:
        sets["stack.speculative.method"] = "nextn"
    topk = sets.get("stack.speculative.eagle_topk", getattr(spec, "eagle_topk", None))
    if str(topk) in ("1", "None") and "stack.speculative.num_draft_tokens" not in sets:
        sets["stack.speculative.eagle_topk"] = "1"
        sets["stack.speculative.num_draft_tokens"] = str(chain_draft_tokens(int(sets[steps_key])))
