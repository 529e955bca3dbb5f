"""Piped output (`sparkit doctor | cat`, a log, `--help | less`) is never broken inside a word or
cut: names, paths and commands stay whole, and help text is wrapped where the lines end, not where
the source's docstrings were wrapped."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sparkit.recipes.load import shipped_recipes


def piped(home, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPARKIT_HOME": str(home)}
    env.pop("COLUMNS", None)  # as `sparkit ... | cat` runs: rich would assume 80 columns
    return subprocess.run([sys.executable, "-m", "sparkit", *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_doctor_piped_keeps_every_recipe_name_and_the_store_path_whole(tmp_path):
    done = piped(tmp_path, "doctor", "--bandwidth", "--bandwidth-mib", "16")
    assert done.returncode == 0, done.stderr
    tokens = set(done.stdout.replace(",", " ").split())
    for name, _ in shipped_recipes():
        assert name in tokens, (name, done.stdout)
    assert f"{tmp_path / 'data' / 'bandwidth.json'}:" in tokens


def test_a_long_path_in_a_message_is_not_broken(tmp_path):
    deep = tmp_path / ("a-directory-with-a-long-name-" * 3) / "recipe.yaml"
    deep.parent.mkdir(parents=True)
    deep.write_text("model:\n  path: org/model\nstack:\n  lm_head: fp16\n")
    done = piped(tmp_path, "plan", str(deep))
    assert done.returncode == 3
    assert str(deep) in done.stderr  # whole, on one line


def help_panel(text: str, title: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"╭─ {title}"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("╰"))
    return lines[start + 1:end]


def premature_breaks(panel: list[str], text_column: int) -> list[str]:
    """Lines broken although the next word would have fitted: a docstring's own line break."""
    bad = []
    for line, after in zip(panel, panel[1:]):
        inner = len(line) - 2
        content = line[1:-1].rstrip()
        continuation = after[1:-1]
        if continuation[:text_column - 1].strip():  # a new entry, not a wrapped line
            continue
        words = continuation.split()
        if words and len(content) + 1 + len(words[0]) <= inner - 1:
            bad.append(f"{content!r} | {words[0]!r}")
    return bad


def test_help_piped_wraps_where_the_line_ends_not_where_the_docstring_did(tmp_path):
    done = piped(tmp_path, "--help")
    assert done.returncode == 0
    commands = help_panel(done.stdout, "Commands")
    column = commands[0].index(commands[0].split()[2])  # where the help text starts (the border counted)
    assert premature_breaks(commands, column) == [], done.stdout
    assert "and the decode speed the memory bandwidth allows it" in " ".join(done.stdout.replace("│", " ").split())
