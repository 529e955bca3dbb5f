"""`sparkit --help` is drawn without typer (sparkit/cli/root_help.py) and must be the screen typer
draws, byte for byte: piped and on a terminal (its colours), at every width a user may have; where
root_help cannot be sure (NO_COLOR, FORCE_COLOR, an ASCII stdout, markup in a summary) typer
draws it, and the user sees no difference either way."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from _shared import REPO_DIR

# The variables that make rich or typer decide on their own (unset for the comparison).
THEIR_SETTINGS = ("FORCE_COLOR", "PY_COLORS", "GITHUB_ACTIONS", "NO_COLOR", "TTY_COMPATIBLE", "TERMINAL_WIDTH",
                  "_TYPER_FORCE_DISABLE_TERMINAL", "COLUMNS", "LINES")
# The edges: the narrowest it draws (50: the options' help fits on one line), the usual, the wide.
WIDTHS = (44, 49, 50, 63, 80, 101, 200)

# Runs in a clean child: typer reads FORCE_COLOR and friends once, when rich_utils is imported.
SIDE_BY_SIDE = r"""
import io, json, os, sys
from sparkit.cli.command_tree import root_command
from sparkit.cli.root_help import root_help

class Stream(io.StringIO):
    def __init__(self, terminal):
        super().__init__()
        self.terminal = terminal
    def isatty(self):
        return self.terminal
    @property
    def encoding(self):
        return "utf-8"

def typers(terminal):
    stream, real = Stream(terminal), sys.stdout
    sys.stdout = stream
    try:
        root_command().main(["--help"], prog_name="sparkit", standalone_mode=False)
    except SystemExit:
        pass
    finally:
        sys.stdout = real
    return stream.getvalue()

out = []
for width in json.loads(sys.argv[1]):
    os.environ["COLUMNS"] = str(width)
    for terminal in (False, True):
        ours = root_help(Stream(terminal))
        out.append({"width": width, "terminal": terminal, "ours": None if ours is None else ours + "\n",
                    "typer": typers(terminal)})
print(json.dumps(out))
"""


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THEIR_SETTINGS}
    return {**env, "PYTHONPATH": str(REPO_DIR), "TERM": "xterm-256color", **extra}


def side_by_side(widths) -> list[dict]:
    done = subprocess.run([sys.executable, "-c", SIDE_BY_SIDE, json.dumps(list(widths))], env=_clean_env(),
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def different(screens: list[dict]) -> list[tuple[int, bool]]:
    """(width, on a terminal) of each screen root_help drew unlike typer's."""
    return [(s["width"], s["terminal"]) for s in screens if s["ours"] is not None and s["ours"] != s["typer"]]


def test_root_help_is_typers_screen_piped_and_on_a_terminal():
    screens = side_by_side(WIDTHS)
    assert not different(screens)
    drawn = [s for s in screens if s["ours"] is not None]
    # it draws the widths people have (it may leave a very narrow terminal to typer)
    assert {(s["width"], s["terminal"]) for s in drawn} >= {(w, t) for w in WIDTHS if w >= 50 for t in (False, True)}
    terminal = next(s for s in drawn if s["terminal"] and s["width"] == 80)["ours"]
    assert "\x1b[1;36m-\x1b[0m\x1b[1;36m-verbose\x1b[0m" in terminal  # typer's colours, as typer splits them
    piped = next(s for s in drawn if not s["terminal"] and s["width"] == 80)["ours"]
    assert "\x1b" not in piped and "╭─ Commands" in piped


@pytest.mark.slow
def test_root_help_is_typers_screen_at_every_width():
    widths = [*range(40, 131), 160, 200, 260]
    screens = side_by_side(widths)
    assert not different(screens)
    assert {s["width"] for s in screens if s["ours"] is not None} == {w for w in widths if w >= 50}


def _sparkit(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkit", *args], env=_clean_env(**env), capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def _imports_typer(*args: str, **env: str) -> tuple[str, bool]:
    """What `sparkit ARGS` writes on stdout, and whether it imported typer for it."""
    code = ("import sys\nfrom sparkit.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('TYPER' if 'typer' in sys.modules else 'NO-TYPER', file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, *args], env=_clean_env(**env), capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    return done.stdout, done.stderr.splitlines()[-1] == "TYPER"


@pytest.mark.parametrize("setting", [{"NO_COLOR": "1"}, {"FORCE_COLOR": "1"}, {"TERMINAL_WIDTH": "100"},
                                     {"PYTHONIOENCODING": "ascii"}])
def test_where_rich_decides_on_its_own_typer_draws_the_screen(setting):
    """Each of these changes what rich draws (no colour, colour in a pipe, typer's own width, ASCII
    boxes): root_help leaves the screen to typer there, which is the same screen as before."""
    shown, used_typer = _imports_typer("--help", **setting)
    shown = re.sub(r"\x1b\[[0-9;]*m", "", shown)
    assert used_typer and "Commands" in shown and "Usage: sparkit [OPTIONS] COMMAND [ARGS]..." in shown


def test_a_summary_with_markup_is_left_to_typer(monkeypatch):
    from sparkit.cli.commands import COMMANDS, CommandInfo
    from sparkit.cli.root_help import root_help

    class Piped:
        encoding = "utf-8"

        def isatty(self) -> bool:
            return False

    environ = {"COLUMNS": "80"}
    assert root_help(Piped(), environ) is not None
    monkeypatch.setitem(COMMANDS, "logs", CommandInfo("logs", "logs", "Print a server's log [bold]now[/]."))
    assert root_help(Piped(), environ) is None  # rich would read the brackets as markup


def test_bare_sparkit_shows_the_same_help_and_exits_2_as_click_does():
    asked = _sparkit("--help")
    bare = _sparkit()
    assert (asked.returncode, bare.returncode) == (0, 2)
    assert asked.stdout == bare.stdout + "\n" and bare.stderr == ""  # click's echo ends --help with one more line
    typers = _sparkit(NO_COLOR="1")  # the same two, drawn by typer
    assert typers.stdout == bare.stdout and typers.returncode == 2


def test_help_into_a_closed_pipe_ends_quietly_with_1_as_rich_does():
    """`sparkit --help | head -1`: the reader went away; no traceback, exit 1, as typer's rich
    console ends (its on_broken_pipe)."""
    results = []
    for env in ({}, {"NO_COLOR": "1"}):  # ours, then typer's
        read, write = os.pipe()
        os.close(read)  # nobody reads: the first write fails with EPIPE
        done = subprocess.run([sys.executable, "-m", "sparkit", "--help"], env=_clean_env(**env), stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120, stdin=subprocess.DEVNULL)
        os.close(write)
        results.append((done.returncode, done.stderr))
    assert results == [(1, ""), (1, "")]
