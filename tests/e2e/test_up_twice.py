"""Issue 39, item 6: `up` twice of the same recipe with `--port auto` silently started a duplicate
server, and a port clash named neither the sparkit run holding the port nor `--port auto`. Issue
40, item 3 through `up`: a variable the recipe lets into the engine is on its preflight's line
(and in --json), and reaches the engine."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e


def _sparkit(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPARKIT_HOME": str(home), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "sparkit", *args], env=env, capture_output=True, text=True, timeout=600)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_dirs(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "runs").iterdir() if p.is_dir())


@pytest.mark.slow
def test_up_of_a_recipe_already_serving_names_the_run_and_a_port_clash_names_its_holder(sparkit_home):
    port = _free_port()
    same = ["tiny", "--set", "server.env.LANG=C.UTF-8", "--set", "server.allow_code_env=[LANG]", "--detach"]
    first = _sparkit(sparkit_home, "up", *same, "--set", f"server.port={port}", "--json")
    try:
        assert first.returncode == 0, first.stderr[-3000:]
        started = json.loads(first.stdout)
        preflight = {c["name"]: c for c in started["preflight"]}
        assert preflight["code_env"]["status"] == "warn" and preflight["code_env"]["data"]["code_env"].keys() == {"LANG"}
        assert "recipe environment" in first.stderr and "LANG" in first.stderr
        assert psutil.Process(started["pid"]).environ()["LANG"] == "C.UTF-8"  # allowed, so it reaches the engine

        # the same recipe and settings, on any port: that run, its URL, nothing started
        again = _sparkit(sparkit_home, "up", *same, "--port", "auto", "--json")
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout) == {"run": started["run"], "url": started["url"], "pid": started["pid"],
                                            "log": started["log"], "reused": True}
        said = " ".join(again.stderr.split())
        assert f"tiny is already running with the same settings: run {started['run']} at {started['url']}" in said
        assert "`sparkit up --new` starts another" in said
        assert _run_dirs(sparkit_home) == [started["run"]]

        # asked on the port it serves: still that run
        assert _sparkit(sparkit_home, "up", *same, "--set", f"server.port={port}").returncode == 0
        assert _run_dirs(sparkit_home) == [started["run"]]

        # --new on the port that run holds: the clash names it, and --port auto
        clash = _sparkit(sparkit_home, "up", *same, "--new", "--set", f"server.port={port}")
        said = " ".join(clash.stderr.split())
        assert clash.returncode == 4, clash.stderr
        assert f"127.0.0.1:{port} is in use, held by sparkit run {started['run']} (tiny, pid {started['pid']})" in said
        assert "hint: `--port auto` picks a free port" in said and f"`sparkit down {started['run']}`" in said

        # --new on a free port: a second server of the same recipe, on purpose
        second = _sparkit(sparkit_home, "up", *same, "--new", "--port", "auto", "--json")
        assert second.returncode == 0, second.stderr[-3000:]
        assert json.loads(second.stdout)["run"] != started["run"] and len(_run_dirs(sparkit_home)) == 2
    finally:
        assert _sparkit(sparkit_home, "down", "--all").returncode == 0


def test_a_port_held_by_another_program_is_named_with_its_pid(sparkit_home):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        clash = _sparkit(sparkit_home, "up", "tiny", "--port", str(port), "--detach")
    me = psutil.Process(os.getpid())
    said = " ".join(clash.stderr.split())
    assert clash.returncode == 4
    assert f"127.0.0.1:{port} is in use, held by pid {me.pid} ({me.name()})" in said
    assert "hint: `--port auto` picks a free port" in said


@pytest.mark.slow
def test_two_ups_of_the_same_recipe_at_once_start_one_server(sparkit_home):
    """Both pass the first look (no run yet) while the test holds the launch lock; the one that
    gets the lock second finds the first's run under it, starting or serving, and starts nothing."""
    import fcntl
    import time

    (sparkit_home / "runs").mkdir(parents=True, mode=0o700)
    env = {**os.environ, "SPARKIT_HOME": str(sparkit_home), "OMP_NUM_THREADS": "1", "COLUMNS": "250"}
    with open(sparkit_home / "runs" / ".launch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ups = [subprocess.Popen([sys.executable, "-m", "sparkit", "up", "tiny", "--detach", "--port", "auto"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        deadline = time.monotonic() + 600
        while not all(any(f.path.endswith(".launch.lock") for f in psutil.Process(p.pid).open_files()) for p in ups):
            assert all(p.poll() is None for p in ups) and time.monotonic() < deadline
            time.sleep(0.05)
    try:
        outcomes = [(p.wait(timeout=600), " ".join(p.stderr.read().split())) for p in ups]
        (run_id,) = _run_dirs(sparkit_home)
        served = [said for code, said in outcomes if code == 0 and f"(detached; `sparkit down {run_id}` stops it)" in said]
        other = [(code, said) for code, said in outcomes if not said.endswith(f"`sparkit down {run_id}` stops it)")]
        assert len(served) == 1 and len(other) == 1, outcomes
        code, said = other[0]
        assert (code == 4 and f"tiny is being started with the same settings by run {run_id}" in said) or \
            (code == 0 and f"tiny is already running with the same settings: run {run_id}" in said), said
    finally:
        assert _sparkit(sparkit_home, "down", "--all").returncode == 0
