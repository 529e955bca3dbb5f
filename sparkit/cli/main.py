"""`sparkit` entry point. Maps SparkitError subclasses to documented exit codes.

Light on purpose: `sparkit --help` (and a bare `sparkit`) is drawn by sparkit.cli.root_help from
the command table alone, without typer; every other command line goes to typer's command tree
(sparkit.cli.command_tree), which imports the module of the one command it runs."""

from __future__ import annotations

import os
import sys
from typing import Any

from sparkit.errors import EXIT_INTERRUPTED, SparkitError


def _print_notice(line: str) -> None:
    print(f"note: {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI. Every error reads the same: `error: ...` (and `hint: ...`) on stderr with
    its documented exit code: sparkit's own errors, usage mistakes (2), unusable paths (1).
    Ctrl-C exits 130. Anything else is a bug: one line, the traceback with SPARKIT_DEBUG=1."""
    _answer_root_help(sys.argv[1:] if argv is None else list(argv))
    import typer

    try:
        from sparkit.cli.command_tree import root_command
        from sparkit.notices import LISTENERS

        if _print_notice not in LISTENERS:
            LISTENERS.append(_print_notice)
        # Not standalone: usage mistakes come back here and read like every other sparkit error.
        outcome = root_command().main(args=argv, prog_name="sparkit", standalone_mode=False)
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


def _answer_root_help(args: list[str]) -> None:
    """`sparkit --help` (exit 0) and a bare `sparkit` (its help, exit 2, as click's no_args_is_help
    does), when sparkit.cli.root_help can draw the screen exactly as typer would; else nothing."""
    if args not in ([], ["--help"]):
        return
    from sparkit.cli.root_help import root_help

    screen = root_help(sys.stdout)
    if screen is None:
        return
    try:
        sys.stdout.write(screen + ("\n" if args else ""))  # click's echo of the (printed) help ends with one more
        sys.stdout.flush()
    except BrokenPipeError:  # `sparkit --help | head`: as rich ends then, quietly with 1
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit fails no more
        sys.exit(1)
    sys.exit(0 if args else 2)


def _print_error(message: str, hint: str | None) -> None:
    from sparkit.cli.common import err_console

    err_console().print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    if hint:
        err_console().print(f"[yellow]hint:[/] {escape(hint)}", highlight=False, soft_wrap=True)


def _is_click_error(exc: BaseException) -> bool:
    # typer vendors click: its exceptions are recognised by what they carry, not their module.
    return hasattr(exc, "format_message") and hasattr(exc, "exit_code")


def escape(text: str) -> str:
    """Rich markup escape without importing rich at module import time."""
    from rich.markup import escape as _escape

    return _escape(text)


def __getattr__(name: str) -> Any:
    # `from sparkit.cli.main import app` (tests drive typer's application in process): the app
    # lives in sparkit.cli.command_tree, imported only when asked for, so that this module stays light.
    if name == "app":
        from sparkit.cli.command_tree import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
