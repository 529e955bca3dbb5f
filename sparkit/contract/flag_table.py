"""The settings tables' shape, and what every engine's table shares.

Each engine declares its settings once, as one table (sparkit.engines.sglang.flags.SETTINGS,
sparkit.engines.embedded.settings.SETTINGS): a row per resolved argument, saying which recipe key sets
it, the engine flag that passes it, how the recipe's value becomes the flag's (`arg`) and what the
live server must then report for it (`expect`). From the table come the engine's argv, the flags a
pass-through may not repeat (the managed destinations) and the resolved args the startup checks
expect.

Both engines report their resolved arguments in SGLang's ServerArgs names (/server_info), so the
names the engine-independent expectations (sparkit.contract.plan.Expectations) are checked under are
one vocabulary: SHARED, declared here once, which each engine's table extends with its flags
(`shared(key, ...)`); the resolved_args check reads EXPECTATION_KEYS from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

# The recipe's three NEXTN numbers (stack.speculative.*), which SGLang takes all or none of.
SPECULATIVE_NUMBERS = ("num_steps", "eagle_topk", "num_draft_tokens")

# SGLang runs NEXTN as EAGLE and reports the algorithm it runs: /server_info says EAGLE for a NEXTN
# launch (the embedded engine takes either name and reports the one it was given).
ALIASES = {"NEXTN": "EAGLE"}

# checks.min_accept_length when a speculative recipe states none (compile writes it into the plan).
DEFAULT_MIN_ACCEPT_LENGTH = 1.5


@dataclass(frozen=True)
class Setting:
    """One resolved argument of an engine and where it comes from."""

    key: str  # the recipe key that sets it (dotted)
    dest: str  # its name in the resolved args (SGLang's ServerArgs spelling)
    # The Expectations field the resolved_args check compares with `dest` (None: none; an engine
    # may still expect a value through `expect`).
    expectation: str | None = None
    flag: str | None = None  # the engine's flag (None: the engine takes no flag for it)
    # A pass-through flag with this destination is an error naming `key` (False: sparkit passes
    # the flag only to turn something off, and a pass-through of it has always been accepted).
    managed: bool = True
    # The flag's value for a launch: None (not passed), True (a bare flag) or the value.
    arg: Callable[[Any], Any] | None = None
    # What the live server must report for it (None: not asserted).
    expect: Callable[[Any], Any] | None = None

    def argv(self, launch: Any) -> list[str]:
        """This row's part of the command line for `launch` (the engine's planned values)."""
        value = self.arg(launch) if self.arg is not None and self.flag else None
        if value is None or value is False:
            return []
        return [self.flag] if value is True else [self.flag, str(value)]  # type: ignore[list-item]


# The settings both engines resolve under the same name and the startup checks compare with an
# Expectations field, in the order the check lists them.
SHARED: dict[str, Setting] = {s.key: s for s in (
    *(Setting(f"stack.speculative.{n}", f"speculative_{n}", n) for n in SPECULATIVE_NUMBERS),
    Setting("stack.tp", "tp_size", "tp"),
    Setting("stack.ep", "ep_size", "ep"),
    Setting("stack.attention_backend", "attention_backend", "attention_backend"),
    Setting("server.mem_fraction_static", "mem_fraction_static", "mem_fraction_static"),
    Setting("stack.moe_backend", "moe_runner_backend", "moe_backend"),
    Setting("stack.speculative.method", "speculative_algorithm"),
    Setting("stack.speculative.draft_model", "speculative_draft_model_path"),
)}

# The resolved-args name each Expectations field is checked under.
EXPECTATION_KEYS: dict[str, str] = {s.expectation: s.dest for s in SHARED.values() if s.expectation}


def recipe_value(recipe: Any, key: str) -> Any:
    """The value of a dotted recipe key ("stack.speculative.num_steps") in a Recipe."""
    value = recipe
    for part in key.split("."):
        value = getattr(value, part)
    return value


def shared(key: str, **engine: Any) -> Setting:
    """The shared row for `key`, with an engine's flag and values."""
    return replace(SHARED[key], **engine)


def command_line(table: tuple[Setting, ...], launch: Any) -> list[str]:
    """The flags of every row for `launch`, in the table's order."""
    return [item for row in table for item in row.argv(launch)]


def expected_args(table: tuple[Setting, ...], launch: Any) -> dict[str, Any]:
    """The resolved args the live server must report for `launch` (rows whose `expect` says one)."""
    out: dict[str, Any] = {}
    for row in table:
        value = row.expect(launch) if row.expect is not None else None
        if value is not None:
            out[row.dest] = value
    return out


def passed(table: tuple[Setting, ...], dest: str, launch: Any) -> str:
    """What the command line for `launch` says for `dest` ("--moe-runner-backend triton"; "": not passed)."""
    return " ".join(next(row for row in table if row.dest == dest).argv(launch))


def managed_dests(table: tuple[Setting, ...]) -> dict[str, str]:
    """Resolved-args name -> the recipe key that sets it, for the flags a pass-through may not repeat."""
    return {row.dest: row.key for row in table if row.managed and row.flag}


def speculative_numbers(spec: Any) -> dict[str, int]:
    """The NEXTN numbers a recipe's stack.speculative gives (none, or all three)."""
    return {n: getattr(spec, n) for n in SPECULATIVE_NUMBERS if getattr(spec, n) is not None}
