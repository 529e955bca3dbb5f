"""The command tree of `sparkit`, as typer builds it, shaped through typer's and click's own
extension points: sparkit's Typer, command and group classes (what every --help shows: a word for
each option's value, never a Python type; paragraphs wrapped where the terminal is, not where the
source was), and the root group, whose commands are sparkit.cli.commands.COMMANDS, each module
imported the first time its command is looked up.

`app` is the typer application (typer.testing.CliRunner drives it in tests); sparkit.cli.main runs
`root_command()`. Importing this module imports typer: the root --help screen never does
(sparkit.cli.root_help)."""

from __future__ import annotations

import copy
import importlib
import inspect
import re
from collections.abc import Iterator, MutableMapping
from typing import Any

import typer
import typer.main
from typer.core import TyperArgument, TyperCommand, TyperGroup

from sparkit._version import __version__
from sparkit.cli.commands import COMMANDS, ROOT_OPTIONS, SPARKIT_HELP

# The word for an option's value, from its type, where its declaration names none (`metavar=`).
# Recent typer names the annotation (bare_type(): "int"); older releases, still installed on some
# machines, only click's type name ("integer").
_TYPE_METAVARS = {"int": "N", "float": "NUMBER", "Path": "PATH", "str": "TEXT",
                  "integer": "N", "path": "PATH", "text": "TEXT"}


def option_metavar(option: Any) -> str:
    """What --help shows for the value of an option whose declaration names no metavar: nothing for
    a flag (typer would print `<bool>`), else a word for its type (N, NUMBER, PATH, TEXT) instead
    of `<int>` or `<list[str]>`."""
    if option.is_flag or option.count:
        return ""
    bare_type = getattr(option, "bare_type", None)
    kind = bare_type() if callable(bare_type) else getattr(getattr(option, "type", None), "name", "")
    return _TYPE_METAVARS.get(kind.removeprefix("list[").removesuffix("]"), "VALUE")


def one_line_paragraphs(text: str) -> str:
    """A docstring's paragraphs, each on one line: its own line breaks are where the source was
    wrapped, not where a terminal is, and rich (typer's rich markup mode) keeps them as breaks."""
    paragraphs = re.split(r"\n\s*\n", inspect.cleandoc(text))
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


class NamedArgument(TyperArgument):
    """A positional argument as sparkit's --help shows it: named in capitals (`up [RECIPE]`, `eval
    compare {A} {B}`), its type left out, since its help says what it is and `<str>` says nothing."""

    @classmethod
    def of(cls, argument: TyperArgument) -> NamedArgument:
        named = copy.copy(argument)  # typer made it; the copy is sparkit's, with the same settings
        named.__class__ = cls
        if named.metavar is None:
            named.metavar = (named.name or "").upper()
        return named

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


def _shown(param: Any) -> Any:
    """A parameter as sparkit's --help shows it (typer ships its own click: its kind, not its class)."""
    kind = getattr(param, "param_type_name", "")
    if kind == "argument" and isinstance(param, TyperArgument):
        return NamedArgument.of(param)
    if kind == "option" and param.metavar is None:
        param.metavar = option_metavar(param)
    return param


class _SparkitHelp:
    """What sparkit's commands and groups add to typer's --help: every parameter shown as _shown
    says, the help text one line per paragraph, and --help itself shown as the flag it is."""

    def __init__(self, *args: Any, params: list[Any] | None = None, help: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, params=[_shown(p) for p in params or []],  # type: ignore[call-arg]
                         help=one_line_paragraphs(help) if help else help, **kwargs)

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""
        return option


class SparkitCommand(_SparkitHelp, TyperCommand):
    """A sparkit command (`sparkit up`, `sparkit recipes list`)."""


class SparkitGroup(_SparkitHelp, TyperGroup):
    """A sparkit command with sub-commands (`sparkit recipes`)."""


class SparkitTyper(typer.Typer):
    """typer.Typer whose commands and groups are sparkit's (SparkitCommand, SparkitGroup), in rich
    markup mode, with no shell-completion options: how every command module declares its group."""

    def __init__(self, *, cls: type[TyperGroup] = SparkitGroup, **kwargs: Any) -> None:
        kwargs.setdefault("rich_markup_mode", "rich")
        kwargs.setdefault("add_completion", False)
        kwargs.setdefault("pretty_exceptions_enable", False)
        super().__init__(cls=cls, **kwargs)

    def command(self, name: str | None = None, *, cls: type[TyperCommand] = SparkitCommand,
                **kwargs: Any) -> Any:
        return super().command(name, cls=cls, **kwargs)


def build_command(name: str) -> Any:
    """The command `name` of COMMANDS as a click command: its module imported (the CLI's one lazy import point),
    its help its summary from COMMANDS, then its function's docstring."""
    info = COMMANDS[name]
    target = getattr(importlib.import_module(f"sparkit.cli.commands.{info.module}"), info.attribute)
    holder = SparkitTyper()
    if isinstance(target, typer.Typer):  # a command with sub-commands
        holder.add_typer(target, name=name, help=info.summary)
    else:
        details = inspect.getdoc(target)
        holder.command(name, help=info.summary + (f"\n\n{details}" if details else ""))(target)
    return typer.main.get_group(holder).commands[name]


class LazyCommands(MutableMapping):
    """The root group's commands: every name of COMMANDS, in its order; each command is built
    (its module imported) the first time it is looked up, so that running one command imports
    only its own module, and a mistyped one is still matched against every name."""

    def __init__(self) -> None:
        self._built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            if name not in COMMANDS:
                raise KeyError(name)
            self._built[name] = build_command(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        del self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter([*COMMANDS, *(n for n in self._built if n not in COMMANDS)])

    def __len__(self) -> int:
        return len(COMMANDS) + sum(n not in COMMANDS for n in self._built)


class SparkitRootGroup(SparkitGroup):
    """`sparkit` itself: its commands are LazyCommands."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands()

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # names only: typer's own would build every command


app = SparkitTyper(cls=SparkitRootGroup, name="sparkit", help=SPARKIT_HELP, no_args_is_help=True)
_VERSION_HELP = dict(ROOT_OPTIONS)["--version"]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"sparkit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help=_VERSION_HELP),
) -> None:
    """sparkit: one command to the fastest correct stack, shown to be active."""


def root_command() -> Any:
    """The `sparkit` click group that sparkit.cli.main runs."""
    return typer.main.get_command(app)
