"""The CLI's one lazy import point (sparkit/cli/commands/__init__.py, COMMANDS): `sparkit --help`
imports no command's module and no typer, rich or click, only the few modules that draw it; a
command imports its own module (and what that module imports), no other command's. What it costs
is benchmarks/cli_startup.py's to measure; these hold the imports that make it cheap."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from _shared import REPO_DIR

# Everything of sparkit's that `sparkit --help` imports: the entry point, the command table, the
# screen, and what they need (the version, the errors main maps to exit codes).
HELP_IMPORTS = ["sparkit", "sparkit._version", "sparkit.cli", "sparkit.cli.commands", "sparkit.cli.main",
                "sparkit.cli.root_help", "sparkit.errors"]
COMMAND_MODULES = "sparkit.cli.commands."


def imported_by(*args: str) -> list[str]:
    """The modules `sparkit ARGS` has imported by the time it exits."""
    code = ("import json, sys\nfrom sparkit.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
            "    pass\nsys.stderr.write('\\nMODULES=' + json.dumps(sorted(sys.modules)))")
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERMINAL_WIDTH")}
    done = subprocess.run([sys.executable, "-c", code, *args], env={**env, "PYTHONPATH": str(REPO_DIR)},
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert "Usage: sparkit" in done.stdout, done.stderr
    return json.loads(done.stderr.rsplit("MODULES=", 1)[1])


def test_help_imports_only_what_draws_it():
    modules = imported_by("--help")
    assert [m for m in modules if m == "sparkit" or m.startswith("sparkit.")] == HELP_IMPORTS
    assert not [m for m in modules if m.split(".")[0] in ("typer", "rich", "click", "torch", "sglang", "textual", "scipy")]


def _siblings_imported_at_top(module: str) -> set[str]:
    """The other command modules `module` (a file of sparkit/cli/commands) imports at its top."""
    tree = ast.parse((REPO_DIR / "sparkit" / "cli" / "commands" / f"{module}.py").read_text())
    return {node.module.removeprefix(COMMAND_MODULES) for node in tree.body
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(COMMAND_MODULES)}


@pytest.mark.parametrize("command", ["status", "check", "recipes"])
def test_a_commands_help_imports_its_own_module_and_no_other_commands(command):
    from sparkit.cli.commands import COMMANDS

    own = COMMANDS[command].module
    modules = imported_by(command, "--help")
    assert {m.removeprefix(COMMAND_MODULES) for m in modules if m.startswith(COMMAND_MODULES)} == {
        own, *_siblings_imported_at_top(own)}
    assert not [m for m in modules if m.split(".")[0] in ("torch", "sglang", "textual", "scipy")]


def test_a_mistyped_command_is_matched_against_every_command_not_only_the_imported_ones():
    done = subprocess.run([sys.executable, "-m", "sparkit", "stauts"], env={**os.environ, "PYTHONPATH": str(REPO_DIR)},
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert done.stderr.startswith("error: No such command 'stauts'. Did you mean 'status'?\n"), done.stderr
