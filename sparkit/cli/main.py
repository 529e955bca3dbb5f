"""`sparkit` entry point. Maps SparkitError subclasses to documented exit codes."""

from __future__ import annotations

import os
import sys

import typer

from sparkit._version import __version__
from sparkit.errors import EXIT_INTERRUPTED, SparkitError

app = typer.Typer(
    name="sparkit",
    help="Fast, provably correct batch-1 MoE decoding: recipes, launch, startup checks, chat, eval, bench.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"sparkit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
) -> None:
    """sparkit: one command to the fastest correct stack, shown to be active."""


def _register_all() -> None:
    # Order here is the order in --help.
    from sparkit.cli import (
        bench_cmd,
        chat_cmd,
        eval_cmd,
        ladder_cmd,
        model_cmd,
        pull_cmd,
        recipes_cmd,
        serve_cmd,
    )

    for module in (recipes_cmd, pull_cmd, serve_cmd, chat_cmd, eval_cmd, bench_cmd, ladder_cmd, model_cmd):
        module.register(app)


_register_all()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI. Every error reads the same: `error: ...` (and `hint: ...`) on stderr with
    its documented exit code: sparkit's own errors, usage mistakes (2), unusable paths (1).
    Ctrl-C exits 130. Anything else is a bug: one line, the traceback with SPARKIT_DEBUG=1."""
    try:
        import typer.main

        command = typer.main.get_command(app)
        tidy_help(command)
        # Not standalone: usage mistakes come back here and read like every other sparkit error.
        outcome = command.main(args=argv, prog_name="sparkit", standalone_mode=False)
        sys.exit(outcome if isinstance(outcome, int) else 0)
    except SparkitError as exc:
        _print_error(exc.message, exc.hint)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    except typer.Abort:  # end of input at a prompt
        sys.exit(1)
    except Exception as exc:
        if _is_click_error(exc):
            ctx = getattr(exc, "ctx", None)
            if not exc.format_message().strip():  # a bare group (`sparkit eval`): its help was shown
                sys.exit(exc.exit_code)
            _print_error(exc.format_message(), f"`{ctx.command_path} --help` lists its arguments and options" if ctx else None)
            sys.exit(exc.exit_code)
        if os.environ.get("SPARKIT_DEBUG"):
            raise
        if isinstance(exc, OSError) and exc.filename:  # a path the user gave cannot be read or written
            _print_error(f"{exc.filename}: {exc.strerror or exc}", "check the path given to --out, --data or the command's file arguments")
            sys.exit(1)
        print(f"internal error: {type(exc).__name__}: {exc}\n(set SPARKIT_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.exit(1)


def _print_error(message: str, hint: str | None) -> None:
    from sparkit.cli.common import err_console

    err_console().print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    if hint:
        err_console().print(f"[yellow]hint:[/] {escape(hint)}", highlight=False, soft_wrap=True)


def _is_click_error(exc: BaseException) -> bool:
    # typer vendors click: its exceptions are recognised by what they carry, not their module.
    return hasattr(exc, "format_message") and hasattr(exc, "exit_code")


# What an option's value is, in --help, where the Python type alone says little.
_METAVARS = {
    "--set": "KEY=VALUE",
    "--against-set": "KEY=VALUE",
    "--param": "KEY=V1,V2,...",
    "--url": "URL",
    "--api-key": "KEY",
    "--port": "PORT",
    "--out": "FILE",
    "--data": "PATH",
    "--recipe": "RECIPE",
    "--against": "RECIPE",
    "--recipe-dir": "DIR",
    "--model": "NAME",
    "--system": "TEXT",
    "--open": "ID",
    "--format": "chat|completion",
    "--metric": "flexible|strict",
    "--dataset": "DATASET",
    "--rounding-changing": "KEY",
    "--timeout": "SECONDS",
    "--grace": "SECONDS",
    "--steps": "N",
    "--kinds": "KIND,...",
    "--depths": "TOKENS,...",
    "--context": "TOKENS",
    "--bandwidth-mib": "MIB",
    "--gsm8k": "N",
    "--gsm8k-data": "PATH",
}
_TYPE_METAVARS = {"int": "N", "float": "NUMBER", "Path": "PATH", "str": "TEXT",
                  "integer": "N", "path": "PATH", "text": "TEXT"}


def _one_line_paragraphs(text: str) -> str:
    """A docstring's paragraphs, each on one line: its own line breaks are where the source was
    wrapped, not where a terminal is, and rich (typer's rich markup mode) keeps them as breaks."""
    import inspect
    import re

    paragraphs = re.split(r"\n\s*\n", inspect.cleandoc(text))
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def tidy_help(command) -> None:
    """Consistent metavars in every --help: flags show none (typer would print `<bool>`),
    options a word for their value (KEY=VALUE, URL, N) instead of `<list[str]>` or `<int>`;
    help texts wrapped where the terminal is, not where the source was."""
    if getattr(command, "help", None):
        command.help = _one_line_paragraphs(command.help)
    for param in command.params:
        # typer ships its own click: recognise options by their kind, not by class.
        kind_of_param = getattr(param, "param_type_name", "")
        if kind_of_param == "argument" and param.metavar is None:
            param.metavar = param.name.upper()  # usage reads `up [RECIPE]`, `eval compare {A} {B}`
            param.display_type_rich = lambda ctx: None  # its help says what it is; `<str>` says nothing
            continue
        if kind_of_param != "option" or param.metavar is not None:
            continue
        if param.is_flag or param.count:
            param.metavar = ""
            continue
        name = next((o for o in param.opts if o.startswith("--")), None)
        # Recent typer names the annotation (bare_type(): "int", "list[str]"); older releases
        # (still what some machines have installed) only have click's type name ("integer").
        bare_type = getattr(param, "bare_type", None)
        kind = bare_type() if callable(bare_type) else getattr(getattr(param, "type", None), "name", "")
        kind = kind.removeprefix("list[").removesuffix("]")
        param.metavar = _METAVARS.get(name) or _TYPE_METAVARS.get(kind, "VALUE")
    if not getattr(command, "_sparkit_tidy_help", False):  # --help is made per call: tidy it there
        make_help_option = command.get_help_option

        def get_help_option(ctx, _make=make_help_option):
            option = _make(ctx)
            if option is not None:
                option.metavar = ""
            return option

        command.get_help_option = get_help_option
        command._sparkit_tidy_help = True
    for sub in getattr(command, "commands", {}).values():
        tidy_help(sub)


def escape(text: str) -> str:
    """Rich markup escape without importing rich at module import time."""
    from rich.markup import escape as _escape

    return _escape(text)


if __name__ == "__main__":
    main()
