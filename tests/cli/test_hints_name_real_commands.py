"""Every `sparkit ...` command that sparkit's own text names (hints, fixes, causes, help, notes)
exists: each is parsed out of every string literal in sparkit/ (f-strings with their
placeholders) and walked down the real Typer app's command tree; each --option must be one the
command takes, and the positional words must fit its arguments."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

import pytest

from _shared import REPO_DIR

PLACEHOLDER = "\x00"  # an f-string's {expression}: any one value
# A command in backticks, as sparkit writes them in messages; and a few written bare, after
# "resume with:" and the like: "sparkit <command>" where <command> is a real top-level name.
BACKTICKED = re.compile(r"`(sparkit(?: [^`]*)?)`")
BARE = re.compile(r"(?<![`\w/.'-])sparkit ([a-z][\w-]*(?: [\w\x00./=-]+)*)")


@dataclass(frozen=True)
class Mention:
    where: str
    command: str


def string_literals(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else PLACEHOLDER for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def mentions(top_level: set[str]) -> list[Mention]:
    found = []
    for path in sorted((REPO_DIR / "sparkit").rglob("*.py")):
        where = path.relative_to(REPO_DIR)
        for line, text in string_literals(ast.parse(path.read_text(), str(path))):
            for m in BACKTICKED.finditer(text):
                found.append(Mention(f"{where}:{line}", m.group(1)))
            for m in BARE.finditer(text):
                words = m.group(1).split()
                if words[0] in top_level and f"`sparkit {m.group(1)}" not in text:
                    found.append(Mention(f"{where}:{line}", "sparkit " + m.group(1)))
    return found


def expand(command: str) -> list[list[str]]:
    """Tokens of a mention; `a|b` (or `a | b`) at one position is one mention per alternative."""
    command = re.split(r"\s[<>]\s", command)[0]  # a shell redirection ends the command (`plan - < mine.yaml`)
    tokens = re.sub(r"\s*\|\s*", "|", command).split()
    out: list[list[str]] = [[]]
    for token in tokens:
        choices = token.split("|") if "|" in token and not token.startswith("-") else [token]
        out = [prefix + [c] for prefix in out for c in choices]
    return out


def problems_of(root, tokens: list[str]) -> str | None:
    """Why `tokens` (without the leading 'sparkit') is not a command of `root`, or None."""
    command, path = root, ["sparkit"]
    i = 0
    while i < len(tokens) and hasattr(command, "commands") and tokens[i] in command.commands:
        command = command.commands[tokens[i]]
        path.append(tokens[i])
        i += 1
    options = {opt: p for p in command.params if getattr(p, "param_type_name", "") == "option" for opt in p.opts + p.secondary_opts}
    options["--help"] = None
    arguments = [p for p in command.params if getattr(p, "param_type_name", "") == "argument"]
    room = sum(float("inf") if a.nargs == -1 else a.nargs for a in arguments)
    positional = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token.startswith("--") or (token.startswith("-") and len(token) == 2):
            name = token.split("=", 1)[0]
            if name not in options:
                return f"`{' '.join(path)}` has no option {name}"
            param = options[name]
            if param is not None and not param.is_flag and "=" not in token and i < len(tokens):
                i += 1  # its value
            continue
        if token == "...":  # "and so on": any further words
            continue
        positional += 1
        if positional > room:
            if room == 0:
                what = "sub-command or argument" if hasattr(command, "commands") else "argument"
                return f"`{' '.join(path)}` takes no {what} {token!r}"
            return f"`{' '.join(path)}` takes {room:.0f} argument(s), {positional} given"
    return None


@pytest.fixture(scope="module")
def app_command():
    import typer.main

    from sparkit.cli.main import app

    return typer.main.get_command(app)


def test_every_sparkit_command_named_in_sparkits_text_exists(app_command):
    found = mentions(set(app_command.commands))
    assert len(found) > 100  # the walk really reads the code's messages
    bad = []
    for mention in found:
        for tokens in expand(mention.command):
            problem = problems_of(app_command, tokens[1:])
            if problem:
                bad.append(f"{mention.where}: {mention.command!r}: {problem}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("text, problem", [
    ("`sparkit model build --force`", "`sparkit model` takes no sub-command or argument 'build'"),
    ("`sparkit up --keep`", "`sparkit up` has no option --keep"),
    ("resume with: sparkit eval gsm8k --out f --resume --again", "`sparkit eval gsm8k` has no option --again"),
    ("`sparkit recipes list|show|remove`", "`sparkit recipes` takes no sub-command or argument 'remove'"),
    ("`sparkit down RUN OTHER`", "`sparkit down` takes 1 argument(s), 2 given"),
])
def test_the_walk_catches_a_command_that_does_not_exist(app_command, text, problem):
    top = set(app_command.commands)
    commands = [m.group(1) for m in BACKTICKED.finditer(text)] or \
        ["sparkit " + m.group(1) for m in BARE.finditer(text) if m.group(1).split()[0] in top]
    assert commands
    found = [problems_of(app_command, tokens[1:]) for c in commands for tokens in expand(c)]
    assert problem in found


@pytest.mark.parametrize("text", [
    "`sparkit up ling-3.0-flash/spark-optimized --set model.path=...`",
    "`sparkit model make-tiny DIR`", "`sparkit eval gsm8k --out FILE --resume`", "`sparkit bench compare A.json B.json`",
    f"`sparkit down {PLACEHOLDER}`", "`sparkit recipes list|show|validate`", "`sparkit doctor --bandwidth`",
])
def test_the_walk_accepts_real_commands(app_command, text):
    for c in (m.group(1) for m in BACKTICKED.finditer(text)):
        for tokens in expand(c):
            assert problems_of(app_command, tokens[1:]) is None, text


def test_the_embedded_engines_suggested_sglang_recipe_is_a_valid_recipe(tmp_path):
    """The preflight's fix for a model the embedded engine cannot serve names a recipe: written
    as it says, it loads and compiles for SGLang."""
    from sparkit.engines.embedded.adapter import serve_elsewhere_hint, sglang_recipe
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    name, text = sglang_recipe("Qwen/Qwen2.5-0.5B-Instruct")
    assert text in serve_elsewhere_hint("Qwen/Qwen2.5-0.5B-Instruct") and f"`sparkit up {name}`" in serve_elsewhere_hint("Qwen/Qwen2.5-0.5B-Instruct")
    (tmp_path / name).write_text(text + "\n")
    plan = compile_plan(load_recipe(str(tmp_path / name)))
    assert plan.engine == "sglang" and plan.model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert "--speculative-algorithm" not in plan.argv
