"""The test environment is the pinned one: every distribution installed beside sparkit is in
constraints.txt at the version it names (so a fresh clone next month runs what this one ran),
and the file pins each name once."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from _shared import REPO_DIR


def pins() -> dict[str, str]:
    out: dict[str, str] = {}
    for number, line in enumerate((REPO_DIR / "constraints.txt").read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        assert match, f"constraints.txt:{number}: not NAME==VERSION: {line!r}"
        name = _normal(match.group(1))
        assert name not in out, f"constraints.txt:{number}: {name} pinned twice"
        out[name] = match.group(2)
    return out


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _public(version: str) -> str:
    return version.split("+", 1)[0]  # torch 2.13.0+cpu satisfies ==2.13.0


def test_every_installed_distribution_is_pinned_at_its_installed_version():
    pinned = pins()
    # setuptools' own vendored copies (setuptools/_vendor/*.dist-info) show up once something in this
    # process put that folder on sys.path (pkg_resources does): they are setuptools', not installed
    installed = {_normal(d.metadata["Name"]): d.version for d in metadata.distributions()
                 if d.metadata["Name"] and "_vendor" not in Path(str(getattr(d, "_path", ""))).parts}
    installed.pop("sparkit", None)
    for tool in ("pip", "setuptools", "wheel"):  # the venv's own tools, not installed by scripts/test
        installed.pop(tool, None)
    unpinned = sorted(set(installed) - set(pinned))
    assert not unpinned, f"installed but not in constraints.txt: {unpinned} (scripts/refresh-constraints)"
    drifted = {name: (installed[name], pinned[name]) for name in installed
               if _public(installed[name]) != _public(pinned[name])}
    assert not drifted, f"installed version != constraints.txt: {drifted}"
