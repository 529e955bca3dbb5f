"""Each option several commands share is declared once (sparkit/cli/options.py, pip's cmdoptions)
and reads the same in every command's --help: no copy of a declaration in a command module,
and no command whose --json, --set, --api-key or --url says something else."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from _shared import REPO_DIR

CLI = REPO_DIR / "sparkit" / "cli"
# The options whose meaning is the same wherever they appear: declared in options.py, nowhere else.
SHARED_EVERYWHERE = ("--json", "--set", "--api-key", "--url")


def declarations(root: Path) -> list[tuple[str, str, str | None]]:
    """(file, flag, help source) of every typer.Option and typer.Argument written under `root`
    (an argument's flag is '<argument>')."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("Option", "Argument") and getattr(node.func.value, "id", "") == "typer"):
                continue
            flags = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")]
            help_ = next((ast.unparse(k.value) for k in node.keywords if k.arg == "help"), None)
            found.append((path.relative_to(root).as_posix(), flags[0] if flags else "<argument>", help_))
    return found


def copied(found: list[tuple[str, str, str | None]]) -> dict[tuple[str, str | None], list[str]]:
    """Declarations written twice: the same flag with the same help, in the files that hold them."""
    where: dict[tuple[str, str | None], list[str]] = defaultdict(list)
    for file, flag, help_ in found:
        where[(flag, help_)].append(file)
    return {key: files for key, files in where.items() if len(files) > 1}


def test_no_option_is_declared_twice_and_the_shared_ones_only_in_options_py():
    found = declarations(CLI)
    assert not copied(found), f"declare it once in sparkit/cli/options.py: {copied(found)}"
    for flag in SHARED_EVERYWHERE:
        assert [file for file, f, _ in found if f == flag] == ["options.py"], flag


def test_a_copied_declaration_is_found(tmp_path):
    (tmp_path / "one.py").write_text('import typer\ndef a(j: bool = typer.Option(False, "--json", help="JSON.")): ...\n')
    (tmp_path / "two.py").write_text('import typer\ndef b(j: bool = typer.Option(False, "--json", help="JSON.")): ...\n'
                                     'def c(k: str = typer.Option("", "--key", help="other")): ...\n')
    assert copied(declarations(tmp_path)) == {("--json", "'JSON.'"): ["one.py", "two.py"]}


def _every_command():
    import typer.main

    from sparkit.cli.command_tree import app

    def walk(command, path):
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    return list(walk(typer.main.get_command(app), ["sparkit"]))


def test_each_shared_option_reads_the_same_in_every_command():
    helps: dict[str, dict[str, str]] = defaultdict(dict)
    for path, command in _every_command():
        for param in command.params:
            for flag in set(getattr(param, "opts", [])) & set(SHARED_EVERYWHERE):
                helps[flag][" ".join(path)] = param.help
    seen = {flag: len(by_command) for flag, by_command in helps.items()}
    assert all(seen.get(flag, 0) >= n for flag, n in {"--json": 21, "--set": 11, "--api-key": 5, "--url": 5}.items()), seen
    assert all(len(set(by_command.values())) == 1 for by_command in helps.values()), helps
