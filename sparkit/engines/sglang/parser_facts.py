"""What a plan asks of the installed sglang's argument parser and environment registry, remembered
on disk: importing `sglang.srt.server_args` costs ~10 s (it pulls torch, transformers and sglang's
own patches), and every `sparkit plan` or `up` of the same recipe asks the same questions.

The record is keyed on the installed sglang itself: its version, where it is installed, the
content (sha256) of the two files the answers come from (srt/server_args.py and srt/environ.py)
and the Python version (argparse's own behaviour). Another sglang, or an edit of either file, is
another key, so an answer is never carried over to a parser that might answer differently. What
is kept is what the real parser said: its option table (each option's destination, whether it
takes a value, whether it is deprecated and for what), the choices of options that have them,
the environment registry, the verdict on each argv parsed so far, and a replica of the parser:
every action's option strings, nargs, value type and choices. A new argv (another recipe, another
--set) is parsed by the replica, plain argparse, which gives the real parser's verdict and message
as long as every option it touches converts its value with a builtin (int, float, str, a flag).
An option whose type or action is sglang's own code (human_readable_int, json.loads, a deprecated
or LoRA action: 24 of 532 in 0.5.23) is replayed only with a value the real parser has accepted
for it before (its conversion depends on the value alone); any other value imports the real
parser, once per process. Either way the answer joins the record. Nothing about sglang that fails to
import is remembered: the next run tries again.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkit.engines.base import package_version
from sparkit.notices import notice
from sparkit.paths import cache_dir, ensure_dir, write_atomic

FORMAT = 2  # 2: the replica of the parser's actions
SOURCES = ("srt/server_args.py", "srt/environ.py")
MAX_VERDICTS = 1024  # argvs remembered per sglang install (the oldest go first)


class ParserRejected(Exception):
    """sglang's argparse parser refused the arguments; str() is its own message."""


@dataclass(frozen=True)
class OptionFact:
    """One option string of sglang's parser, as the plan's checks need it."""

    dest: str
    takes_value: bool
    deprecated: bool = False
    new_flag: str | None = None


def install_key() -> tuple[str | None, str | None, str | None]:
    """(key, version, why sglang is unavailable) of the installed sglang, found without
    importing it. The key is None when sglang is missing or its files cannot be read."""
    try:
        spec = importlib.util.find_spec("sglang")
    except Exception as exc:  # a broken install, or an import hook that refuses it
        return None, None, f"{type(exc).__name__}: {exc}".splitlines()[0]
    if spec is None or not spec.submodule_search_locations:
        return None, None, "ModuleNotFoundError: No module named 'sglang'"
    root = Path(next(iter(spec.submodule_search_locations)))
    version = package_version("sglang")
    digest = hashlib.sha256(json.dumps([FORMAT, version, str(root), sys.version]).encode())
    for relative in SOURCES:
        try:
            digest.update(relative.encode() + b"\0" + (root / relative).read_bytes())
        except OSError:
            return None, version, None  # cannot fingerprint: ask the real parser every time
    return digest.hexdigest()[:24], version, None


@dataclass
class ParserFacts:
    """The installed sglang's parser, answered from the record where it can be."""

    key: str | None
    version: str | None
    unavailable: str | None = None  # why the parser does not import here (None: it does, or the record says it did)
    options: dict[str, OptionFact] = field(default_factory=dict)
    choices: dict[str, list[str]] = field(default_factory=dict)
    env: frozenset[str] = frozenset()
    verdicts: dict[str, str | None] = field(default_factory=dict)  # json(argv) -> the parser's error, None = accepted
    actions: list[dict[str, Any]] = field(default_factory=list)  # the replica (action_record rows)
    accepted: dict[str, list[str]] = field(default_factory=dict)  # dest -> json(values) the real parser took
    remembered: bool = False  # the tables came from the record, not from importing sglang
    _parser: Any = None
    _replica: Any = None
    _dirty: bool = False

    # -- answers --------------------------------------------------------------------------

    def check(self, args: list[str]) -> None:
        """Raise ParserRejected with sglang's own message when its parser refuses `args`."""
        key = json.dumps(args)
        if key not in self.verdicts:
            verdict = self._replayed(args)
            if verdict is _NOT_REPLAYED:
                try:
                    self.real_parser().parse_args(args)
                    verdict = None
                except ParserRejected as exc:
                    verdict = str(exc)
                if verdict is None and self._replica is not None:  # what the real parser took of its own options, the replica may take again
                    for dest, value in self._replica[1].items():
                        if value not in self.accepted.setdefault(dest, []):
                            self.accepted[dest].append(value)
            self.verdicts.pop(key, None)
            self.verdicts[key] = verdict
            self._dirty = True
        if self.verdicts[key] is not None:
            raise ParserRejected(self.verdicts[key])

    def option(self, flag: str) -> OptionFact | None:
        """The option `flag` names (`--flag` or `--flag=value`), or a unique abbreviation of one."""
        name = flag.split("=", 1)[0]
        if name in self.options:
            return self.options[name]
        matches = {id(f): f for s, f in self.options.items() if s.startswith(name)}
        return next(iter(matches.values())) if len(matches) == 1 else None

    def exact_option(self, flag: str) -> OptionFact | None:
        return self.options.get(flag.split("=", 1)[0])

    @property
    def answered_from_record(self) -> bool:
        """Every answer so far came from the record: sglang was not imported in this process."""
        return self.remembered and self._parser is None

    def _replayed(self, args: list[str]):
        """The replica's verdict on `args` (None: accepted, else argparse's message), or
        _NOT_REPLAYED when it touched an option only the real parser can judge."""
        if not self.actions:
            return _NOT_REPLAYED
        if self._replica is None:
            self._replica = build_replica(self.actions, self.accepted)
        parser, touched = self._replica
        touched.clear()
        try:
            parser.parse_args(args)
            verdict = None
        except ParserRejected as exc:
            verdict = str(exc)
        return _NOT_REPLAYED if touched else verdict

    # -- the real parser ------------------------------------------------------------------

    def real_parser(self) -> argparse.ArgumentParser:
        if self._parser is None:
            notice(f"importing sglang {self.version or ''} to ask its argument parser (about 10 s on an idle "
                   "machine, once: what it answers is remembered for this install)")
            self._parser = build_real_parser()
        return self._parser

    def learn_from_real_parser(self) -> None:
        """Fill the tables from the real parser and registry (imports sglang)."""
        parser = self.real_parser()
        options: dict[str, OptionFact] = {}
        choices: dict[str, list[str]] = {}
        for action in parser._actions:
            fact = OptionFact(action.dest, action.nargs != 0, type(action).__name__.startswith("Deprecated"),
                              getattr(action, "new_flag", None))
            for string in action.option_strings:
                options[string] = fact
            if action.choices and action.dest not in choices:
                choices[action.dest] = [str(c) for c in action.choices]
        from sglang.srt.environ import Envs

        self.options, self.choices = options, choices
        self.actions = [action_record(action) for action in parser._actions if action.option_strings]
        self.env = frozenset(n for n, v in vars(Envs).items() if type(v).__name__.startswith("Env"))
        self._dirty = True

    # -- the record -----------------------------------------------------------------------

    def to_record(self) -> dict[str, Any]:
        kept = list(self.verdicts.items())[-MAX_VERDICTS:]
        return {"format": FORMAT, "sglang": self.version, "key": self.key,
                "options": {s: [f.dest, f.takes_value, f.deprecated, f.new_flag] for s, f in self.options.items()},
                "choices": self.choices, "env": sorted(self.env), "verdicts": dict(kept), "actions": self.actions,
                "accepted": self.accepted}

    @classmethod
    def from_record(cls, data: dict[str, Any], key: str, version: str | None) -> ParserFacts:
        options = {s: OptionFact(str(v[0]), bool(v[1]), bool(v[2]), v[3] if isinstance(v[3], str) else None)
                   for s, v in data["options"].items()}
        verdicts = {str(k): (None if v is None else str(v)) for k, v in data.get("verdicts", {}).items()}
        actions = [dict(a) for a in data.get("actions", []) if isinstance(a, dict)]
        accepted = {str(k): [str(x) for x in v] for k, v in data.get("accepted", {}).items()}
        return cls(key, version, None, options, {k: [str(c) for c in v] for k, v in data["choices"].items()},
                   frozenset(map(str, data["env"])), verdicts, actions, accepted, remembered=True)

    def save(self) -> None:
        """Write the record if anything was learnt (a failure to write costs only speed)."""
        if not self._dirty or self.key is None or self.unavailable is not None or not self.options:
            return

        path = record_path(self.key)
        try:
            ensure_dir(path.parent)
            write_atomic(path, json.dumps(self.to_record()))
            self._dirty = False
        except OSError:
            pass


def record_path(key: str) -> Path:
    return cache_dir() / "sglang-parser" / f"{key}.json"


def build_real_parser() -> argparse.ArgumentParser:
    """sglang's own server-args parser, raising ParserRejected instead of exiting."""
    from sglang.srt.server_args import ServerArgs

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str):  # argparse would print usage and exit(2)
            raise ParserRejected(message)

    parser = _Parser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


# -- the replica ---------------------------------------------------------------------------

_NOT_REPLAYED = object()
# Value types argparse applies by name, identical in the replica (its messages name them: "invalid
# int value"); anything else is sglang's code.
_BUILTIN_TYPES = {"int": int, "float": float, "str": str}
# Action classes whose behaviour is argparse's own (sglang's deprecated and LoRA actions are not).
_REPLAYED_ACTIONS = {"_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
                     "_StoreConstAction": "store_const", "_AppendAction": "append", "_CountAction": "count",
                     "BooleanOptionalAction": argparse.BooleanOptionalAction}


def action_record(action: argparse.Action) -> dict[str, Any]:
    """What the replica needs of one action, and whether it can stand in for it."""
    type_name = None if action.type is None else getattr(action.type, "__name__", repr(action.type))
    kind = type(action).__name__
    choices = list(action.choices) if action.choices is not None else None
    replayable = (kind in _REPLAYED_ACTIONS and (type_name is None or type_name in _BUILTIN_TYPES)
                  and (choices is None or all(isinstance(c, str | int | float) for c in choices))
                  and (action.nargs is None or isinstance(action.nargs, int) or action.nargs in ("?", "*", "+")))
    return {"strings": list(action.option_strings), "dest": action.dest, "kind": kind, "nargs": action.nargs,
            "type": type_name, "choices": choices if replayable else None, "replayable": replayable}


def build_replica(actions: list[dict[str, Any]], accepted: dict[str, list[str]]
                  ) -> tuple[argparse.ArgumentParser, dict[str, str]]:
    """A plain argparse parser with the recorded actions, and what a parse gave the options only
    the real parser can judge, with values it has not accepted before (dest -> json(values);
    cleared by the caller before each parse)."""
    touched: dict[str, str] = {}

    class _Touched(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            value = json.dumps(values)
            if value not in accepted.get(self.dest, ()):
                touched[self.dest] = value

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str):
            raise ParserRejected(message)

    parser = _Parser(prog="sglang serve", add_help=False)
    for row in actions:
        strings, kind = row["strings"], row["kind"]
        if not row.get("replayable"):
            # takes what the real action takes (a flag: nothing), so the parse reaches the end and says it was used
            flag = kind in ("_StoreTrueAction", "_StoreFalseAction", "_StoreConstAction", "_CountAction",
                            "DeprecatedStoreTrueAction", "DeprecatedStoreConstAction") or row["nargs"] == 0
            parser.add_argument(*strings, dest=row["dest"], action=_Touched, nargs=0 if flag else row["nargs"])
            continue
        kwargs: dict[str, Any] = {"dest": row["dest"], "action": _REPLAYED_ACTIONS[kind]}
        if kind in ("_StoreAction", "_AppendAction"):
            kwargs["nargs"] = row["nargs"]
            if row["type"]:
                kwargs["type"] = _BUILTIN_TYPES[row["type"]]
            if row["choices"] is not None:
                kwargs["choices"] = row["choices"]
        elif kind == "_StoreConstAction":
            kwargs["const"] = None
        parser.add_argument(*strings, **kwargs)
    return parser, touched


def load_facts() -> ParserFacts:
    """The installed sglang's facts: from the record when there is one for this very install,
    else from importing sglang (and then recorded); `unavailable` says why there are none."""
    key, version, missing = install_key()
    if missing is not None:
        return ParserFacts(None, version, missing)
    if key is not None:
        try:
            data = json.loads(record_path(key).read_text())
            if data.get("format") == FORMAT and data.get("key") == key:
                return ParserFacts.from_record(data, key, version)
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
            pass  # no record, or one this sparkit cannot read: ask sglang
    facts = ParserFacts(key, version)
    try:
        facts.learn_from_real_parser()
    except Exception as exc:  # ImportError, or a dependency of sglang failing to import
        return ParserFacts(None, version, f"{type(exc).__name__}: {exc}".splitlines()[0])
    return facts
