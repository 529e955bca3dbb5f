"""Issue 29, item 1: state another user can plant. Each attack is performed for real: as root, a
second user (nobody, uid 65534) makes or writes the directories; sparkit runs as real processes.

- A state root (SPARKIT_HOME, or the default XDG directories) or a run directory that is not the
  user's own, or that others can write, is refused (exit 10, the fix named), so a forged run
  record never makes `down` signal the forger's choice of process.
- Files of the state are opened without following links (and what was opened is checked), so a
  planted link never has `up` write the engine log, or `logs` read, another file.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from sparkit.errors import StateError
from sparkit.paths import open_output, write_atomic

NOBODY = 65534
# The attacker's interpreter: one the second user can run by itself (this venv's may live below
# root's 0700 home); its scripts need only the standard library.
ATTACKER_PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)
root_only = pytest.mark.skipif(os.geteuid() != 0 or ATTACKER_PYTHON is None,
                               reason="a second user needs root (nobody runs the attacker's side) and a system python3")


def drop_to_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    os.umask(0)


def as_nobody(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run Python code as the second user (nobody), umask 0, as an attacker would."""
    proc = subprocess.run([ATTACKER_PYTHON, "-I", "-c", textwrap.dedent(code), *args], preexec_fn=drop_to_nobody,
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 0, proc.stderr
    return proc


def sparkit(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkit", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def shared_dir():
    """A directory every user may create things in, as /tmp (sticky, 1777), that sparkit may
    put a state root below."""
    path = Path(tempfile.mkdtemp(prefix="sparkit-shared-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def victim():
    """A process of the user's (root's), in its own session, that nobody asked sparkit to stop."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    ProcessIdentity = __import__("sparkit.runs.processes", fromlist=["ProcessIdentity"]).ProcessIdentity
    for _ in range(200):
        identity = ProcessIdentity.of(proc.pid)
        if identity and identity.cmdline and identity.cmdline[0] == "sleep":
            break
        time.sleep(0.01)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def forged_record(victim: subprocess.Popen) -> dict:
    """A run record that names `victim` exactly as sparkit identifies an engine (pid, group, start
    time, argv: all of it readable by any user in /proc)."""
    p = psutil.Process(victim.pid)
    return {"id": "forged", "recipe_name": "tiny", "recipe_path": None, "engine": "embedded",
            "url": "http://127.0.0.1:9", "host": "127.0.0.1", "port": 9, "pid": victim.pid,
            "pgid": os.getpgid(victim.pid), "started_at": "2026-12-01T00:00:00+00:00", "state": "running",
            "detached": True, "create_time": p.create_time(), "cmdline": p.cmdline()}


FORGE = """
    import json, os, sys
    home, record = sys.argv[1], sys.argv[2]
    os.makedirs(os.path.join(home, "runs", "forged"), mode=0o777)
    with open(os.path.join(home, "runs", "forged", "meta.json"), "w") as handle:
        handle.write(record)
"""


@pytest.mark.slow
@root_only
def test_a_home_another_user_made_is_refused_and_down_signals_nobody(shared_dir, victim):
    """The attack: nobody makes SPARKIT_HOME (mode 777) and forges a run record naming a process of
    its choosing; root's `sparkit down --all` signalled it. Now every command refuses the home."""
    home = shared_dir / "home"
    as_nobody(FORGE, str(home), json.dumps(forged_record(victim)))
    assert home.stat().st_uid == NOBODY
    env = {**os.environ, "SPARKIT_HOME": str(home)}
    down = sparkit(env, "down", "--all")
    time.sleep(0.5)
    assert victim.poll() is None, "the forged record had sparkit signal the victim"
    assert down.returncode == 10, down.stderr
    said = " ".join(down.stderr.split())
    assert f"sparkit's state directory {home} belongs to nobody (uid {NOBODY}), not to you" in said
    assert "hint:" in said and "SPARKIT_HOME" in said and "Traceback" not in said
    for command in (["status"], ["up", "tiny", "--detach"], ["logs"], ["check"], ["down", "forged"]):
        refused = sparkit(env, *command)
        assert refused.returncode == 10 and "belongs to nobody" in refused.stderr, (command, refused.stderr)
    assert victim.poll() is None
    assert sorted(p.name for p in (home / "runs").iterdir()) == ["forged"]  # up made no run there


@pytest.mark.slow
@root_only
def test_a_home_of_the_user_that_others_can_write_is_refused(shared_dir, victim):
    home = shared_dir / "home"
    (home / "runs" / "forged").mkdir(parents=True)
    home.chmod(0o777)
    (home / "runs" / "forged" / "meta.json").write_text(json.dumps(forged_record(victim)))
    down = sparkit({**os.environ, "SPARKIT_HOME": str(home)}, "down", "--all")
    assert down.returncode == 10 and victim.poll() is None
    assert "is writable by its group and every user (mode 0777)" in " ".join(down.stderr.split())
    assert f"chmod go-w {home}" in down.stderr
    home.chmod(0o700)  # the fix the hint names; the forged directory (0777) is still refused
    (home / "runs" / "forged").chmod(0o777)
    down = sparkit({**os.environ, "SPARKIT_HOME": str(home)}, "down", "--all")
    assert down.returncode == 10 and victim.poll() is None
    assert f"the run directory {home / 'runs' / 'forged'} is writable by" in " ".join(down.stderr.split())


@root_only
def test_a_run_directory_another_user_owns_is_refused(tmp_path, victim):
    home = tmp_path / "home"
    forged = home / "runs" / "forged"
    forged.mkdir(parents=True, mode=0o700)
    (forged / "meta.json").write_text(json.dumps(forged_record(victim)))
    os.chown(forged, NOBODY, NOBODY)
    os.chown(forged / "meta.json", NOBODY, NOBODY)
    down = sparkit({**os.environ, "SPARKIT_HOME": str(home)}, "down", "--all")
    assert down.returncode == 10 and victim.poll() is None
    assert f"the run directory {forged} belongs to nobody" in " ".join(down.stderr.split())


@root_only
def test_the_default_state_directories_are_checked_too(shared_dir, victim):
    """Without SPARKIT_HOME: the platform's state directory ($XDG_STATE_HOME/sparkit) made by
    another user is refused the same way."""
    xdg = shared_dir / "state"
    as_nobody(FORGE, str(xdg / "sparkit"), json.dumps(forged_record(victim)))
    env = {k: v for k, v in os.environ.items() if k != "SPARKIT_HOME"}
    env.update(XDG_STATE_HOME=str(xdg), XDG_DATA_HOME=str(shared_dir / "mine-data"),
               XDG_CACHE_HOME=str(shared_dir / "mine-cache"))
    down = sparkit(env, "down", "--all")
    assert down.returncode == 10 and victim.poll() is None
    assert f"sparkit's state directory {xdg / 'sparkit'} belongs to nobody" in " ".join(down.stderr.split())


@root_only
def test_a_directory_above_the_home_that_others_can_write_is_refused(shared_dir):
    """Whoever can rename an ancestor can swap the home for their own after it is checked."""
    above = shared_dir / "above"
    as_nobody("import os, sys; os.mkdir(sys.argv[1], 0o777)", str(above))
    home = above / "home"
    home.mkdir(mode=0o700)  # the user's own, 0700, but below nobody's directory
    status = sparkit({**os.environ, "SPARKIT_HOME": str(home)}, "status")
    assert status.returncode == 10
    said = " ".join(status.stderr.split())
    assert f"{above}, above sparkit's state directory {home}, belongs to nobody" in said


@root_only
def test_a_home_that_is_another_user_s_link_to_the_user_s_own_state_is_refused(shared_dir, tmp_path):
    """Issue 40, item 12: nobody's link, SPARKIT_HOME=/tmp/.../home -> root's own state, was
    accepted (its target is root's, 0700); nobody can point it at a home of their own, with a forged
    record, whenever they like. The link itself must be the user's (or root's)."""
    mine = tmp_path / "state"
    (mine / "runs").mkdir(parents=True, mode=0o700)
    mine.chmod(0o700)
    link = shared_dir / "home"
    as_nobody("import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(mine), str(link))
    assert os.lstat(link).st_uid == NOBODY
    status = sparkit({**os.environ, "SPARKIT_HOME": str(link)}, "status")
    assert status.returncode == 10, status.stderr
    said = " ".join(status.stderr.split())
    assert f"{link}, on the way to sparkit's state directory {link}, is a symbolic link that belongs to nobody" in said
    assert "hint:" in said and "Traceback" not in said
    for command in (["down", "--all"], ["up", "tiny", "--detach"]):
        refused = sparkit({**os.environ, "SPARKIT_HOME": str(link)}, *command)
        assert refused.returncode == 10 and "belongs to nobody" in refused.stderr, (command, refused.stderr)
    assert os.listdir(mine / "runs") == []
    own = shared_dir / "own-link"  # the user's own link there (sticky: nobody can replace it) is used
    own.symlink_to(mine)
    assert sparkit({**os.environ, "SPARKIT_HOME": str(own)}, "status").returncode == 0


@pytest.mark.slow
@root_only
def test_up_refuses_a_home_where_the_log_could_be_swapped_for_a_link(shared_dir, tmp_path):
    """The attack: in nobody's home, nobody watched for the new run directory, swapped it for its
    own holding `server.log -> a root-only file`, and root's `up` appended the engine log to that
    file. Now `up` refuses the home before it makes anything."""
    target = tmp_path / "root-only"
    target.write_text("root's file\n")
    home = shared_dir / "home"
    as_nobody("import os, sys; os.makedirs(os.path.join(sys.argv[1], 'runs'), 0o777)", str(home))
    swapper = subprocess.Popen([ATTACKER_PYTHON, "-I", "-c", textwrap.dedent("""
        import os, sys, time
        runs, target = sys.argv[1], sys.argv[2]
        seen, end = set(os.listdir(runs)), time.time() + 90
        while time.time() < end:
            for name in set(os.listdir(runs)) - seen:
                seen.add(name)
                os.rename(os.path.join(runs, name), os.path.join(runs, name + ".moved"))
                os.mkdir(os.path.join(runs, name), 0o777)
                os.symlink(target, os.path.join(runs, name, "server.log"))
                sys.exit(0)
    """), str(home / "runs"), str(target)], preexec_fn=drop_to_nobody, cwd="/")
    try:
        up = sparkit({**os.environ, "SPARKIT_HOME": str(home)}, "up", "tiny", "--detach", "--port", "auto", timeout=300)
    finally:
        swapper.kill()
        swapper.wait()
        sparkit({**os.environ, "SPARKIT_HOME": str(home)}, "down", "--all")
    assert target.read_text() == "root's file\n"
    assert up.returncode == 10 and "belongs to nobody" in up.stderr, up.stderr
    assert os.listdir(home / "runs") == []


# -- links inside a trusted state --------------------------------------------------------------------------


def test_a_state_file_is_never_written_through_a_link(sparkit_home, tmp_path):
    """Defence in depth: even in the user's own state, a link where a run file belongs is refused
    (O_NOFOLLOW), not followed; the file it points at is untouched."""
    run_dir = sparkit_home / "runs" / "r1"
    run_dir.mkdir(parents=True)
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me\n")
    (run_dir / "server.log").symlink_to(target)
    with pytest.raises(StateError) as info:
        open_output(run_dir / "server.log", "ab")
    assert f"{run_dir / 'server.log'} is a symbolic link (to {target})" in str(info.value)
    assert target.read_text() == "keep me\n"


def test_write_atomic_never_writes_through_a_link_planted_at_its_temporary_name(sparkit_home, tmp_path):
    import threading

    run_dir = sparkit_home / "runs" / "r1"
    run_dir.mkdir(parents=True)
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me\n")
    planted = run_dir / f".meta.json.{os.getpid()}.{threading.get_ident()}.tmp"
    planted.symlink_to(target)
    write_atomic(run_dir / "meta.json", "{}")
    assert target.read_text() == "keep me\n"
    assert (run_dir / "meta.json").read_text() == "{}" and not planted.exists() and not planted.is_symlink()


def test_a_hard_link_to_another_file_is_refused(sparkit_home, tmp_path):
    run_dir = sparkit_home / "runs" / "r1"
    run_dir.mkdir(parents=True)
    other = sparkit_home / "other"
    other.write_text("keep me\n")
    os.link(other, run_dir / "checks.json")
    with pytest.raises(StateError, match="has 2 names"):
        open_output(run_dir / "checks.json", "w")
    assert other.read_text() == "keep me\n"


def test_logs_never_read_another_file_through_a_link(sparkit_home, tmp_path):
    """`sparkit logs` of a run whose server.log is a link prints an error, not the file behind it."""
    from sparkit.runs.store import Run, RunState

    secret = tmp_path / "secret"
    secret.write_text("TOP SECRET\n")
    secret.chmod(0o600)
    run = Run(id="r1", recipe_name="tiny", recipe_path=None, engine="embedded", url="http://127.0.0.1:9",
              host="127.0.0.1", port=9, started_at="2026-12-01T00:00:00+00:00", state=RunState.STOPPED)
    run.path.mkdir(parents=True)
    run.save()
    run.log_path.symlink_to(secret)
    logs = sparkit({**os.environ, "SPARKIT_HOME": str(sparkit_home)}, "logs", "r1")
    assert "TOP SECRET" not in logs.stdout and logs.returncode == 10
    assert "is a symbolic link" in logs.stderr


def test_a_link_where_a_state_directory_belongs_is_refused(sparkit_home, tmp_path):
    sparkit_home.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (sparkit_home / "runs").symlink_to(elsewhere)
    status = sparkit({**os.environ, "SPARKIT_HOME": str(sparkit_home)}, "status")
    assert status.returncode == 10 and f"{sparkit_home / 'runs'} is a symbolic link" in " ".join(status.stderr.split())


def test_a_home_an_older_sparkit_left_readable_is_tightened_not_refused(sparkit_home):
    """Readable by others (0755, an older sparkit under umask 022) is no way to plant anything:
    such a home keeps working, and is made private."""
    from sparkit.paths import ensure_dir, runs_dir

    (sparkit_home / "runs").mkdir(parents=True)
    for path in (sparkit_home, sparkit_home / "runs"):
        path.chmod(0o755)
    status = sparkit({**os.environ, "SPARKIT_HOME": str(sparkit_home)}, "status", "--json")
    assert status.returncode == 0, status.stderr
    ensure_dir(runs_dir() / "r1")
    assert {stat.S_IMODE(p.stat().st_mode) for p in (sparkit_home, sparkit_home / "runs", sparkit_home / "runs" / "r1")} == {0o700}
