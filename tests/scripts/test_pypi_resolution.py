"""Both README set-up commands install from PyPI alone, as on a user's machine.

This machine's pip is configured with local wheels (a CPU torch 2.13.0 among them) that nobody else
has; a constraints file that only resolves here (triton==3.9.0 beside torch 2.13.0, whose PyPI wheel
pins triton==3.7.1) would leave every user outside unable to install. scripts/resolve-on-pypi asks
pip, with its configuration switched off and https://pypi.org/simple as the only index, to resolve
(1) the README's install line word for word and (2) every install scripts/test makes; each must
resolve, and every package it would install must be pinned in constraints.txt at that version.
Network: these tests need pypi.org (CI here reaches it); without it they skip, saying so.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest

from _shared import REPO_DIR

pytestmark = pytest.mark.slow


def _resolver():
    loader = SourceFileLoader("resolve_on_pypi", str(REPO_DIR / "scripts" / "resolve-on-pypi"))
    spec = importlib.util.spec_from_loader("resolve_on_pypi", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


RESOLVER = _resolver()


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path = REPO_DIR / "constraints.txt") -> dict[str, str]:
    return {_normal(line.split("==")[0]): line.split("==")[1].strip()
            for line in path.read_text().splitlines() if "==" in line and not line.startswith("#")}


def readme_install_args() -> list[str]:
    """The pip arguments of the README's first set-up command, as a user copies it."""
    text = (REPO_DIR / "README.md").read_text()
    commands = re.findall(r"```bash\n(python3 -m venv \.venv && .*?)\n```", text, re.S)
    assert len(commands) == 1, "the README's bring-up command (python3 -m venv .venv && ...) not found once"
    words = shlex.split(commands[0])
    start = words.index("install", words.index(".venv/bin/pip")) + 1
    end = words.index("&&", start)
    return words[start:end]


def script_installs() -> list[list[str]]:
    """The argument lists of scripts/test's pip_install calls (continuation lines joined; the
    optional index argument, a shell expansion, left out: its effect is checked by the torch pin)."""
    text = (REPO_DIR / "scripts" / "test").read_text().replace("\\\n", " ")
    calls = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("pip_install "):
            line = re.sub(r"\$\{[^}]*\}", "", line)
            calls.append(shlex.split(line, comments=True)[1:])  # a trailing "# ..." is bash's comment
    assert calls, "scripts/test makes no pip_install call"
    return calls


def resolve_or_skip(requirements, constraints=REPO_DIR / "constraints.txt", no_deps=False):
    result = RESOLVER.resolve(requirements, constraints, no_deps=no_deps)
    if result.get("unreachable"):
        pytest.skip(f"PyPI cannot be reached from here ({result['error']}): the resolution was not checked")
    return result


def assert_pinned(result: dict) -> None:
    pinned = pins()
    installs = {_normal(name): version for name, version in result["installs"].items() if _normal(name) != "sparkit"}
    unpinned = sorted(set(installs) - set(pinned))
    assert not unpinned, f"PyPI's resolution installs packages constraints.txt does not pin: {unpinned}"
    drifted = {name: (version, pinned[name]) for name, version in installs.items() if version != pinned[name]}
    assert not drifted, drifted


def test_the_readme_install_line_resolves_from_pypi_alone():
    args = readme_install_args()
    assert args[:2] == ["-c", "constraints.txt"], args  # the pins apply to the user's install too
    result = resolve_or_skip(args[2:])
    assert result["ok"], result.get("error")
    assert result["installs"]["torch"] == "2.13.0"
    assert_pinned(result)
    # the big wheels' metadata is read by range requests: nothing of torch's size is downloaded
    assert not [name for name in result["downloaded"] if name.startswith(("torch-", "nvidia_", "triton-"))], result["downloaded"]


def test_every_install_scripts_test_makes_resolves_from_pypi_alone():
    calls = script_installs()
    resolving = [args for args in calls if "--no-deps" not in args]
    together = [word for args in resolving for word in args]
    result = resolve_or_skip(together)
    assert result["ok"], result.get("error")
    assert_pinned(result)
    for args in (args for args in calls if "--no-deps" in args):  # sglang, humming-kernels: the pinned release exists
        alone = resolve_or_skip([word for word in args if word != "--no-deps"], no_deps=True)
        assert alone["ok"], (args, alone.get("error"))
        assert_pinned(alone)


def test_a_pin_pypi_cannot_satisfy_is_caught(tmp_path):
    """The failure users outside hit before: triton pinned where torch 2.13.0's wheel says 3.7.1."""
    broken = tmp_path / "constraints.txt"
    broken.write_text(re.sub(r"^triton==.*$", "triton==3.9.0", (REPO_DIR / "constraints.txt").read_text(), flags=re.M))
    result = resolve_or_skip(["torch==2.13.0"], broken)
    assert not result["ok"]
    assert "triton" in result["error"] and ("ResolutionImpossible" in result["error"] or "conflict" in result["error"])
