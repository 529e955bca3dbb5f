"""`sparkit doctor` finds sparkit itself however it was installed (issue 39 item 4).

Under the README's editable install the package is mapped by setuptools' finder on sys.meta_path,
not by a directory on sys.path: looking only at sys.path (importlib's PathFinder), doctor said
"sparkit not installed" and judged every pair with sparkit in it unknown. Each install a user can
have is run for real: the editable one this suite runs in, a wheel built from this checkout and
installed into a directory of its own, and `python -m sparkit` of each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _shared import REPO_DIR

pytest.importorskip("sglang")


def doctor_sparkit(cwd: Path, *args: str, env: dict | None = None) -> dict:
    done = subprocess.run([*args, "doctor", "--json"], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    installed = doc["compatibility"]["sglang"]["installed"]["sparkit"]
    judged = [f for f in doc["compatibility"]["sglang"]["findings"] if "sparkit" in f["pair"]]
    return {"installed": installed, "pairs": [f["pair"] for f in judged]}


def editable_install() -> Path | None:
    """Where this venv's editable sparkit points (None when sparkit is not installed -e here)."""
    from importlib import metadata

    for dist in metadata.distributions(name="sparkit"):
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
        if direct.get("dir_info", {}).get("editable"):
            return Path(direct["url"].removeprefix("file://"))
    return None


@pytest.mark.parametrize("launcher", ["script", "python -m"])
def test_doctor_sees_the_editable_install(tmp_path, launcher):
    checkout = editable_install()
    if checkout is None:
        pytest.skip("this venv's sparkit is not an editable install (scripts/test makes one)")
    env = {"PYTHONPATH": ""}  # the install alone says where sparkit is
    args = [str(Path(sys.executable).with_name("sparkit"))] if launcher == "script" else [sys.executable, "-m", "sparkit"]
    seen = doctor_sparkit(tmp_path, *args, env=env)
    assert seen["installed"]["version"] == "0.1.0"
    assert Path(seen["installed"]["source"]) == checkout / "sparkit"
    assert seen["pairs"] and not [p for p in seen["pairs"] if "sparkit not installed" in p], seen["pairs"]


@pytest.mark.slow
def test_doctor_sees_a_wheel_install(tmp_path):
    wheels, target, source = tmp_path / "wheels", tmp_path / "site", tmp_path / "source"
    # built from a copy of the tracked files: a build in place leaves sparkit.egg-info in the checkout,
    # which then answers every metadata lookup made from there
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_DIR, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_DIR / name, source / name, follow_symlinks=False)  # sparkit/_shipped_recipes is a link
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(wheels), str(source)], capture_output=True, text=True, timeout=600,
                           cwd=tmp_path)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = wheels.glob("sparkit-*.whl")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                              str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-2000:]
    # the wheel's directory first on the path: an import takes it over the venv's editable sparkit
    env = {"PYTHONPATH": str(target)}
    seen = doctor_sparkit(tmp_path, sys.executable, "-m", "sparkit", env=env)
    assert Path(seen["installed"]["source"]) == target / "sparkit"
    assert seen["installed"]["version"] == "0.1.0"
    assert seen["pairs"] and not [p for p in seen["pairs"] if "sparkit not installed" in p], seen["pairs"]
    # the wheel carries the shipped recipes: an installed sparkit plans the default recipe
    listed = subprocess.run([sys.executable, "-m", "sparkit", "recipes", "list", "--json"], cwd=tmp_path, env={
        **os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    recipes = json.loads(listed.stdout)
    assert {"tiny", "ling-3.0-flash/spark-optimized"} <= {r["name"] for r in recipes}
    assert all(r["path"].startswith(str(target / "sparkit" / "_shipped_recipes")) for r in recipes), recipes[0]
