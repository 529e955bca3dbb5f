"""Issue 29, item 6: a full disk under SPARKIT_HOME (a real small tmpfs; root only). `status`,
`down`, `check` and `up` ended in `internal error: OSError: [Errno 28]` naming no file, `down`
stopped the engine but left meta.json saying `running`, and `up` left an empty run directory.
Now each names the file and what to do, and the records stay true."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from _shared import fill_disk

pytestmark = pytest.mark.e2e


@pytest.fixture
def full_home(tmp_path):
    """SPARKIT_HOME on its own 4 MiB tmpfs (room for a start), to be filled."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(home)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield home
    subprocess.run([sys.executable, "-m", "sparkit", "down", "--all"], env=env_for(home), capture_output=True, timeout=120)
    subprocess.run(["umount", "-l", str(home)], check=True)


def env_for(home: Path) -> dict[str, str]:
    return {**os.environ, "SPARKIT_HOME": str(home), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "COLUMNS": "200"}


def sparkit(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkit", *args], env=env_for(home), capture_output=True, text=True,
                          timeout=timeout)


def fill(home: Path, leave: int = 0) -> Path:
    """Fill the file system, then free `leave` bytes (tmpfs counts whole pages)."""
    return fill_disk(home, leave)


def no_internal_error(proc: subprocess.CompletedProcess) -> None:
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def meta(home: Path, run_id: str) -> dict:
    return json.loads((home / "runs" / run_id / "meta.json").read_text())


def test_a_full_disk_keeps_records_true_and_names_the_file(full_home):
    up = sparkit(full_home, "up", "tiny", "--detach", "--port", "auto", "--json")
    assert up.returncode == 0, up.stderr
    run_id = json.loads(up.stdout)["run"]
    pid = json.loads(up.stdout)["pid"]
    checks_file = full_home / "runs" / run_id / "checks.json"
    first = json.loads(checks_file.read_text())["checked_at"]
    filler = fill(full_home)

    check = sparkit(full_home, "check", "--json")  # the record of the checks has room where it is
    no_internal_error(check)
    assert check.returncode == 0, check.stderr
    assert json.loads(checks_file.read_text())["checked_at"] != first
    with_room = {c["name"]: c["status"] for c in json.loads(check.stdout)["checks"]}

    checks_file.unlink()  # a record that needs new space: the checks are still shown, and why they are not saved
    filler.unlink()
    filler = fill(full_home)
    check = sparkit(full_home, "check", "--json")
    no_internal_error(check)
    assert check.returncode == 0, check.stderr
    results = {c["name"]: c for c in json.loads(check.stdout)["checks"]}
    saved = results["results_saved"]
    assert saved["status"] == "warn" and "No space left on device" in saved["detail"]
    assert str(checks_file) in saved["detail"] and "df -h" in saved["fix"]
    # every other check judges as it did with room (a check with nothing to judge on this recipe skips both times)
    assert {name: c["status"] for name, c in results.items() if name != "results_saved"} == {
        name: status for name, status in with_room.items() if name != "results_saved"}
    assert "fail" not in with_room.values()

    status = sparkit(full_home, "status", "--json")
    no_internal_error(status)
    assert status.returncode == 0 and json.loads(status.stdout)["runs"][0]["state"] == "running"

    # another server of the same recipe (--new: without it, `up` names the running one and reuses it),
    # refused before it makes anything
    again = sparkit(full_home, "up", "tiny", "--new", "--detach", "--port", "auto")
    no_internal_error(again)
    assert again.returncode == 4 and "disk space for the run" in again.stderr, again.stderr
    assert "df -h" in again.stderr
    assert sorted(p.name for p in (full_home / "runs").iterdir() if not p.name.startswith(".")) == [run_id]

    down = sparkit(full_home, "down")
    no_internal_error(down)
    assert down.returncode == 0, down.stderr
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert meta(full_home, run_id)["state"] == "stopped"  # rewritten in place: the record is true
    filler.unlink()


def test_an_engine_that_died_on_a_full_disk_is_recorded_as_exited(full_home):
    up = sparkit(full_home, "up", "tiny", "--detach", "--port", "auto", "--json")
    assert up.returncode == 0, up.stderr
    run_id, pid = json.loads(up.stdout)["run"], json.loads(up.stdout)["pid"]
    fill(full_home)
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.1)
    status = sparkit(full_home, "status", "--all", "--json")
    no_internal_error(status)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["runs"][0]["state"] == "exited"
    assert meta(full_home, run_id)["state"] == "exited"


def test_a_launch_on_a_full_disk_names_the_file_and_leaves_no_empty_run(full_home, monkeypatch):
    """Past preflight (the library's launch, as tune and verify call it): the plan cannot be
    written, so the error names plan.json and no empty run directory is left."""
    from sparkit.errors import StateError
    from sparkit.paths import ensure_dir, runs_dir
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe
    from sparkit.runs import launch

    monkeypatch.setenv("SPARKIT_HOME", str(full_home))
    ensure_dir(runs_dir())
    plan = compile_plan(load_recipe("tiny"))
    plan.recipe_name = "x" * 60
    plan.env = {f"PAD_{i}": "y" * 200 for i in range(100)}  # a plan of ~25 KB: more than the disk has left
    fill(full_home, leave=8192)
    with pytest.raises(StateError) as info:
        launch(plan, timeout=60)
    message = str(info.value)
    assert "No space left on device" in message and str(runs_dir()) in message and "df -h" in message
    assert os.listdir(runs_dir()) == []
