"""What a plan asks of the installed sglang's argument parser and environment registry, remembered
on disk: importing `sglang.srt.server_args` costs ~10 s (it pulls torch, transformers and sglang's
own patches), and every `sparkit plan` or `up` of the same recipe asks the same questions.

The record is keyed on the installed sglang itself: its version, where it is installed, the
content (sha256) of the two files the answers come from (srt/server_args.py and srt/environ.py)
and the Python version (argparse's own behaviour). Another sglang, or an edit of either file, is
another key, so an answer is never carried over to a parser that might answer differently. What
is kept is what the real parser said: its option table (each option's destination, whether it
takes a value, whether it is deprecated and for what), the choices of options that have them,
the environment registry, and the verdict on each argv parsed so far. A question the record
cannot answer (an argv not seen before) imports the real parser, once per process, and the
answer joins the record. Nothing about sglang that fails to import is remembered: the next run
tries again.
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
from sparkit.paths import cache_dir, ensure_dir, write_atomic

FORMAT = 1
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
    remembered: bool = False  # the tables came from the record, not from importing sglang
    _parser: Any = None
    _dirty: bool = False

    # -- answers --------------------------------------------------------------------------

    def check(self, args: list[str]) -> None:
        """Raise ParserRejected with sglang's own message when its parser refuses `args`."""
        key = json.dumps(args)
        if key not in self.verdicts:
            try:
                self.real_parser().parse_args(args)
                verdict = None
            except ParserRejected as exc:
                verdict = str(exc)
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

    # -- the real parser ------------------------------------------------------------------

    def real_parser(self) -> argparse.ArgumentParser:
        if self._parser is None:
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
        self.env = frozenset(n for n, v in vars(Envs).items() if type(v).__name__.startswith("Env"))
        self._dirty = True

    # -- the record -----------------------------------------------------------------------

    def to_record(self) -> dict[str, Any]:
        kept = list(self.verdicts.items())[-MAX_VERDICTS:]
        return {"format": FORMAT, "sglang": self.version, "key": self.key,
                "options": {s: [f.dest, f.takes_value, f.deprecated, f.new_flag] for s, f in self.options.items()},
                "choices": self.choices, "env": sorted(self.env), "verdicts": dict(kept)}

    @classmethod
    def from_record(cls, data: dict[str, Any], key: str, version: str | None) -> ParserFacts:
        options = {s: OptionFact(str(v[0]), bool(v[1]), bool(v[2]), v[3] if isinstance(v[3], str) else None)
                   for s, v in data["options"].items()}
        verdicts = {str(k): (None if v is None else str(v)) for k, v in data.get("verdicts", {}).items()}
        return cls(key, version, None, options, {k: [str(c) for c in v] for k, v in data["choices"].items()},
                   frozenset(map(str, data["env"])), verdicts, remembered=True)

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
