"""`sparkit` entry point. Maps SparkitError subclasses to documented exit codes."""

from __future__ import annotations

import os
import sys

import typer

from sparkit import __version__
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
        model_cmd,
        recipes_cmd,
        serve_cmd,
    )

    for module in (recipes_cmd, serve_cmd, chat_cmd, eval_cmd, bench_cmd, model_cmd):
        module.register(app)


_register_all()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI. Typer handles usage errors (exit 2) itself; sparkit's own errors
    are printed as one clear message with their documented exit code."""
    try:
        app(args=argv, prog_name="sparkit")
    except SparkitError as exc:
        from sparkit.cli.common import err_console

        err_console().print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False, soft_wrap=True)
        if exc.hint:
            err_console().print(f"[yellow]hint:[/] {escape(exc.hint)}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # a bug in sparkit: say so briefly, the full trace only on request
        if os.environ.get("SPARKIT_DEBUG"):
            raise
        print(f"internal error: {type(exc).__name__}: {exc}\n(set SPARKIT_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.exit(1)


def escape(text: str) -> str:
    """Rich markup escape without importing rich at module import time."""
    from rich.markup import escape as _escape

    return _escape(text)


if __name__ == "__main__":
    main()
