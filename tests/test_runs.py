"""Process lifecycle of sparkit.runs: launch, progress, failure diagnosis, stop, status.

The engine here is a small real HTTP server process (a stand-in written below)
that logs SGLang's startup lines; the real engines are exercised in tests/e2e.
It lets each failure mode (exit during start, never healthy, SIGTERM ignored,
forked children) happen for real, quickly.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import sys
import textwrap
import time

import psutil
import pytest

from sparkit.contract.plan import Expectations, LaunchPlan
from sparkit.errors import EngineError, LaunchError
from sparkit.runs import (
    RunState,
    free_port,
    launch,
    list_runs,
    mark_stale,
    resolve_server,
    select_run,
    stop,
)

STAND_IN = textwrap.dedent(
    '''
    import http.server, os, signal, subprocess, sys, time
    mode, port = sys.argv[1], int(sys.argv[2])
    print("[2026-11-29 10:00:00] server_args={'tp_size': 1}", flush=True)
    print("[2026-11-29 10:00:01 TP0] Load weight begin. avail mem=10.00 GB", flush=True)
    if mode == "port-in-use":
        print("OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', %d): address already in use" % port, flush=True)
        sys.exit(1)
    print("[2026-11-29 10:00:02 TP0] Load weight end. elapsed=0.10 s, type=Stand, avail mem=9.00 GB, mem usage=1.00 GB.", flush=True)
    print("[2026-11-29 10:00:03 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=9.00 GB", flush=True)
    print("[2026-11-29 10:00:04 TP0] Capture target decode CUDA graph end. elapsed=0.10 s, mem usage=0.10 GB, avail mem=8.90 GB.", flush=True)
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode in ("fork", "ignore-term"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("child pid %d" % child.pid, flush=True)
    print("env key=%s" % os.environ.get("SPARKIT_API_KEY"), flush=True)
    print("report dir=%s" % os.environ.get("SPARKIT_REPORT_DIR"), flush=True)
    print("argv=%s" % sys.argv, flush=True)
    if mode == "hang":
        time.sleep(600)
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a):
            pass
    server = http.server.HTTPServer(("127.0.0.1", port), Handler)
    print("The server is fired up and ready to roll!", flush=True)
    server.serve_forever()
    '''
)


@pytest.fixture
def stand_in(tmp_path):
    path = tmp_path / "stand_in_engine.py"
    path.write_text(STAND_IN)
    return path


def make_plan(script, mode="ok", engine="embedded", api_key_env=None) -> LaunchPlan:
    port = free_port()
    return LaunchPlan(
        engine=engine, argv=[sys.executable, str(script), mode, str(port)], env={"STAND_IN": "1"},
        host="127.0.0.1", port=port, model="stand-in", served_model_name="stand-in", recipe_name="stand-in",
        recipe_path=None, expectations=Expectations(), api_key_env=api_key_env,
    )


def group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.Error, OSError):
            pass
    return members


def child_pid(run) -> int:
    for line in run.log_path.read_text().splitlines():
        if line.startswith("child pid "):
            return int(line.split()[-1])
    raise AssertionError("no child pid in the log")


def test_launch_reports_phases_then_stop_leaves_no_process(sparkit_home, stand_in):
    events = []
    plan = make_plan(stand_in, "fork")
    run = launch(plan, on_progress=events.append, timeout=60)
    try:
        meta = run
        assert meta.pid and meta.pgid == meta.pid
        assert os.getpgid(meta.pid) == meta.pid != os.getpgid(0)  # its own process group
        assert json.loads(run.plan_path.read_text())["argv"] == plan.argv
        assert f"report dir={run.path}" in run.log_path.read_text()
        phases = [e.phase for e in events]
        assert phases[0] == "starting" and phases[-1] == "ready"
        from sparkit.contract import STARTUP_PHASES as PHASES

        order = [PHASES.index(p) for p in phases]
        assert order == sorted(order)  # the phase line never goes backwards
        assert "capturing CUDA graphs" in phases  # read from the log (the stand-in logs SGLang's lines)
        status = run.status()
        assert status["state"] == "running" and status["healthy"] is True and status["pid"] == meta.pid
        assert run.state is RunState.RUNNING and run.ready_s is not None
        assert select_run(None).id == run.id
        assert resolve_server().url == plan.url
        # a --url that is this run's own URL is this run (chat then shows its recipe and checks)
        by_url = resolve_server(url=plan.url + "/")
        assert by_url.url == plan.url and by_url.run is not None and by_url.run.id == run.id
        assert resolve_server(url="http://127.0.0.1:9").run is None
        kid = child_pid(run)
        assert psutil.pid_exists(kid)
    finally:
        stop(run, grace=5)
    assert group_members(meta.pgid) == []
    assert not psutil.pid_exists(kid) or psutil.Process(kid).status() == psutil.STATUS_ZOMBIE
    assert run.reload().state is RunState.STOPPED
    assert run.reload().status()["state"] == "stopped"


def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(sparkit_home, stand_in):
    run = launch(make_plan(stand_in, "ignore-term"), timeout=60)
    pgid = run.pgid
    stop(run, grace=0.5)
    assert group_members(pgid) == []


def test_engine_exiting_during_start_is_diagnosed_and_leaves_nothing(sparkit_home, stand_in):
    with pytest.raises(LaunchError) as info:
        launch(make_plan(stand_in, "port-in-use"), timeout=60)
    message = str(info.value)
    assert "the engine exited during start (port in use)" in message
    assert "address already in use" in message  # the last log lines are shown
    assert "--port" in info.value.hint
    run = list_runs()[-1]
    assert run.state is RunState.FAILED and run.failure == "port in use"
    assert group_members(run.pgid) == []


def test_timeout_is_honoured_and_the_group_is_stopped(sparkit_home, stand_in):
    with pytest.raises(LaunchError) as info:
        launch(make_plan(stand_in, "hang"), timeout=3)
    assert "did not become healthy within 3 s" in str(info.value)
    run = list_runs()[-1]
    assert group_members(run.pgid) == []


def test_missing_engine_executable(sparkit_home, stand_in):
    plan = make_plan(stand_in)
    plan.argv = ["/nonexistent/sglang-engine", "serve"]
    with pytest.raises(LaunchError) as info:
        launch(plan, timeout=5)
    assert "engine not installed" in str(info.value)


def test_api_key_reaches_the_engine_but_never_argv_or_plan(sparkit_home, stand_in, monkeypatch):
    monkeypatch.setenv("MY_SPARKIT_KEY", "s3cret-value")
    run = launch(make_plan(stand_in, api_key_env="MY_SPARKIT_KEY"), timeout=60)
    try:
        log = run.log_path.read_text()
        assert "env key=s3cret-value" in log
        argv_line = next(line for line in log.splitlines() if line.startswith("argv="))
        assert "s3cret" not in argv_line
        assert "s3cret" not in run.plan_path.read_text() and "s3cret" not in run.meta_path.read_text()
    finally:
        stop(run, grace=5)


@pytest.mark.parametrize("engine", ["embedded", "sglang"])
def test_an_exported_key_does_not_reach_an_engine_whose_recipe_names_none(sparkit_home, stand_in, monkeypatch, engine):
    # $SPARKIT_API_KEY is the clients' variable for a --url server and the embedded engine's own:
    # exported in the shell, it must not make a keyless recipe's server demand it.
    monkeypatch.setenv("SPARKIT_API_KEY", "exported-for-clients")
    run = launch(make_plan(stand_in, engine=engine), timeout=60)
    try:
        log = run.log_path.read_text()
        assert "env key=None" in log and "exported-for-clients" not in log
        assert "--config" not in log  # nor a key file for SGLang
        assert run.api_key is None
    finally:
        stop(run, grace=5)


def test_a_run_sends_its_recipes_key_and_an_option_wins_over_it(sparkit_home, stand_in, monkeypatch):
    monkeypatch.setenv("MY_SPARKIT_KEY", "s3cret-value")
    monkeypatch.setenv("SPARKIT_API_KEY", "exported-for-clients")
    run = launch(make_plan(stand_in, api_key_env="MY_SPARKIT_KEY"), timeout=60)
    try:
        assert "env key=s3cret-value" in run.log_path.read_text()  # the recipe's key, not the exported one
        assert resolve_server().api_key == "s3cret-value"
        assert resolve_server(url=run.url).api_key == "s3cret-value"  # a --url that is this run's
        assert resolve_server(api_key="typed").api_key == "typed"
        # a server sparkit did not start: the option, else $SPARKIT_API_KEY
        assert resolve_server(url="http://127.0.0.1:9").api_key == "exported-for-clients"
        assert resolve_server(url="http://127.0.0.1:9", api_key="typed").api_key == "typed"
        monkeypatch.delenv("MY_SPARKIT_KEY")  # this shell lacks the recipe's variable: no key, not another
        assert resolve_server().api_key is None
    finally:
        stop(run, grace=5)


def test_sglang_api_key_goes_through_a_private_config_file(sparkit_home, stand_in, monkeypatch):
    monkeypatch.setenv("MY_SPARKIT_KEY", "s3cret-value")
    seen = {}

    def look_at_the_file(event):  # while the engine starts, the key is in a private file
        secrets = list(sparkit_home.glob("runs/*/secrets.yaml"))
        if secrets and "mode" not in seen:
            seen["mode"] = stat.S_IMODE(secrets[0].stat().st_mode)
            seen["text"] = secrets[0].read_text()

    run = launch(make_plan(stand_in, engine="sglang", api_key_env="MY_SPARKIT_KEY"), on_progress=look_at_the_file, timeout=60)
    try:
        assert seen["mode"] == 0o600
        assert "s3cret-value" in seen["text"]
        assert "--config" in run.log_path.read_text()  # argv names the file, not the key
        assert "s3cret" not in run.plan_path.read_text()
        assert not (run.path / "secrets.yaml").exists()  # removed once the engine is up
    finally:
        stop(run, grace=5)


def test_missing_api_key_is_a_launch_error(sparkit_home, stand_in, monkeypatch):
    monkeypatch.delenv("MY_SPARKIT_KEY", raising=False)
    with pytest.raises(LaunchError, match=r"\$MY_SPARKIT_KEY"):
        launch(make_plan(stand_in, api_key_env="MY_SPARKIT_KEY"), timeout=5)


def test_a_run_that_died_without_down_is_marked_stale(sparkit_home, stand_in):
    run = launch(make_plan(stand_in), timeout=60)
    meta = run
    os.killpg(meta.pgid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while group_members(meta.pgid) and time.monotonic() < deadline:
        from sparkit.runs.processes import reap

        reap(meta.pid)
        time.sleep(0.05)
    assert run.observed_state() is RunState.EXITED  # before anything recorded it
    assert [r.id for r in mark_stale()] == [run.id]
    assert run.reload().state is RunState.EXITED and run.reload().status()["state"] == "exited"
    stop(run)  # harmless on a dead run
    assert run.reload().state is RunState.STOPPED


def test_ctrl_c_while_starting_leaves_no_process(sparkit_home, stand_in):
    """KeyboardInterrupt (what SIGINT raises) during the wait stops the group before propagating."""
    seen: list[str] = []

    def interrupt_once_loading(event):
        seen.append(event.phase)
        if event.phase in ("loading weights", "capturing CUDA graphs", "warming up"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        launch(make_plan(stand_in, "fork"), on_progress=interrupt_once_loading, timeout=60)
    run = list_runs()[-1]
    assert group_members(run.pgid) == []
    assert run.reload().state is RunState.STOPPED


def test_model_builds_report_progress_before_start(sparkit_home, stand_in, tiny_model_dir):
    plan = make_plan(stand_in)
    plan.model_builds = [{"name": "tiny-ling", "seed": 0, "dir": str(tiny_model_dir)}]  # already built: reused
    events = []
    run = launch(plan, on_progress=events.append, timeout=60)
    stop(run, grace=5)
    builds = [e for e in events if e.phase == "building model"]
    assert builds and builds[-1].fraction == 1.0 and "tiny-ling" in builds[-1].message
    assert events.index(builds[-1]) < [e.phase for e in events].index("starting")


def test_find_run_by_id_prefix_and_recipe_name(sparkit_home, stand_in):
    from sparkit.errors import UsageError

    plan = make_plan(stand_in)
    plan.recipe_name = "tiny/tiny-wrong-draft"
    run = launch(plan, timeout=60)
    try:
        assert run.id.startswith("tiny-tiny-wrong-draft-")
        assert select_run(run.id[:20]).id == run.id
        assert select_run("tiny/tiny-wrong-draft").id == run.id
        assert select_run("tiny-wrong-draft").id == run.id
        with pytest.raises(UsageError):
            select_run("no-such-run")
    finally:
        stop(run, grace=5)
    with pytest.raises(EngineError, match="no running server"):  # exit 7: no server to talk to
        select_run(None)


def test_follow_log_streams_and_ends_when_the_engine_is_gone(sparkit_home, stand_in):
    from sparkit.runs import follow_log

    run = launch(make_plan(stand_in), timeout=60)
    try:
        seen = []
        for line in follow_log(run, from_start=True):
            seen.append(line)
            if "fired up" in line:
                break
        assert any(line.startswith("[2026-11-29 10:00:01 TP0] Load weight begin") for line in seen)
    finally:
        stop(run, grace=5)
    drained = list(follow_log(run, from_start=True))  # returns by itself: nothing is running
    assert "The server is fired up and ready to roll!" in drained


@pytest.mark.slow
def test_cli_with_no_runs(sparkit_home):
    import subprocess

    env = {**os.environ, "SPARKIT_HOME": str(sparkit_home)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "sparkit", *args], env=env, capture_output=True, text=True, timeout=60)

    status = cli("status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["runs"] == []
    down = cli("down")  # nothing to stop is not a mistake: cleanup scripts call `sparkit down`
    assert down.returncode == 0 and "no servers running" in down.stderr and "Traceback" not in down.stderr
    down_json = cli("down", "--json")
    assert down_json.returncode == 0 and json.loads(down_json.stdout)["stopped"] == []
    down_named = cli("down", "nosuchrun")  # a RUN that does not exist still is
    assert down_named.returncode == 2 and "no run matches 'nosuchrun'" in down_named.stderr
    check = cli("check", "--url", "http://127.0.0.1:9")
    assert check.returncode == 2 and "--recipe" in check.stderr
    bad_port = cli("up", "--port", "http")
    assert bad_port.returncode == 2 and "--port 'http'" in bad_port.stderr


def test_one_selection_rule_prefers_the_live_run_a_name_matches(sparkit_home, stand_in):
    first = make_plan(stand_in)
    first.recipe_name = "tiny"
    older = launch(first, timeout=60)
    second = make_plan(stand_in)
    second.recipe_name = "tiny"
    newer = launch(second, timeout=60)
    stop(newer, grace=5)
    try:
        # The latest run of recipe "tiny" is stopped; a command naming "tiny" means the live one.
        assert select_run("tiny").id == older.id
        assert select_run(None).id == older.id
    finally:
        stop(older, grace=5)
    assert select_run("tiny").id == newer.id  # none live: the latest
    with pytest.raises(EngineError):
        select_run(None)
    assert select_run(None, include_stopped=True).id == newer.id  # `sparkit logs` reads a stopped run


def test_a_record_of_an_older_sparkit_still_reads(sparkit_home):
    from sparkit.runs import Run

    path = sparkit_home / "runs" / "tiny-20261101-000000-abcd"
    path.mkdir(parents=True)
    (path / "meta.json").write_text(json.dumps({
        "id": "tiny-20261101-000000-abcd", "recipe_name": "tiny", "recipe_path": None, "engine": "embedded",
        "url": "http://127.0.0.1:1", "host": "127.0.0.1", "port": 1, "pid": None, "pgid": None,
        "started_at": "2026-11-01T00:00:00+00:00", "api_key_env": None, "detached": True,
        "extra": {"state": "failed", "failure": "port in use"}}))
    run = Run.open(path)
    assert run.state is RunState.FAILED and run.failure == "port in use"
    assert [r.id for r in list_runs()] == [run.id]


def test_up_refuses_before_starting_anything_when_preflight_fails(sparkit_home, stand_in):
    import socket

    from sparkit.errors import PreflightError
    from sparkit.runs import up

    plan = make_plan(stand_in)
    with socket.socket() as taken:  # something already listens on the plan's port
        taken.bind(("127.0.0.1", plan.port))
        taken.listen()
        with pytest.raises(PreflightError) as info:
            up(plan, timeout=60)
    assert "port" in str(info.value)
    assert list_runs() == []  # no run directory, no process


def test_a_transient_server_is_stopped_however_its_block_ends(sparkit_home, stand_in, tiny_model_dir):
    from sparkit.runs import transient_server

    plan = make_plan(stand_in, "fork")
    # A checkpoint the embedded engine serves passes preflight's model check (it downloads
    # nothing, so a hub id no longer would); the stand-in is what actually runs.
    plan.model = str(tiny_model_dir)
    with pytest.raises(RuntimeError):
        with transient_server(plan, timeout=60) as started:
            assert started.run.live and started.server.url == started.plan.url
            pgid = started.run.pgid
            raise RuntimeError("the benchmark failed")
    assert group_members(pgid) == []
    assert list_runs()[-1].state is RunState.STOPPED


# -- never signal a stranger --------------------------------------------------------------------


def sparkit_cli(home, *args):
    import subprocess

    env = {**os.environ, "SPARKIT_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "sparkit", *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def stranger():
    """An unrelated program leading its own session and process group (what a reused pid or
    process-group number now belongs to)."""
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    yield psutil.Process(proc.pid)
    proc.kill()
    proc.wait()


def dead_run(stand_in):
    """A real run whose engine was killed without `down` (its record still says running)."""
    run = launch(make_plan(stand_in), timeout=60)
    os.killpg(run.pgid, signal.SIGKILL)
    from sparkit.runs.processes import reap

    deadline = time.monotonic() + 10
    while group_members(run.pgid) and time.monotonic() < deadline:
        reap(run.pid)
        time.sleep(0.05)
    return run


@pytest.mark.slow
@pytest.mark.parametrize("forged", ["pid reused", "pgid reused", "create_time missing", "cmdline differs"])
def test_down_never_signals_a_process_that_is_not_the_recorded_engine(sparkit_home, stand_in, stranger, forged):
    run = dead_run(stand_in)
    meta = json.loads(run.meta_path.read_text())
    assert meta["cmdline"][:3] == [sys.executable, str(stand_in), "ok"] and meta["create_time"]  # as the OS saw it
    if forged == "pid reused":  # the dead leader's pid (and group number) is the stranger's now
        meta.update(pid=stranger.pid, pgid=stranger.pid)
    elif forged == "pgid reused":  # leader gone; its group number names the stranger's group
        meta.update(pgid=stranger.pid)
    elif forged == "create_time missing":  # a record that cannot tell the stranger from the engine
        meta.update(pid=stranger.pid, pgid=stranger.pid, create_time=None, cmdline=None)
    else:  # same start time (clock tolerance), another program
        meta.update(pid=stranger.pid, pgid=stranger.pid, create_time=stranger.create_time())
    run.meta_path.write_text(json.dumps(meta))
    down = sparkit_cli(sparkit_home, "down", run.id)
    assert down.returncode == 0, down.stderr
    time.sleep(0.5)  # a SIGTERM would have ended it by now
    assert stranger.is_running() and stranger.status() != psutil.STATUS_ZOMBIE
    assert f"{run.id} was not running" in down.stderr
    status = json.loads(sparkit_cli(sparkit_home, "status", "--json", "--all").stdout)["runs"]
    assert [r["state"] for r in status] == ["stopped"]


def test_down_still_stops_the_recorded_engine_and_what_its_group_left(sparkit_home, stand_in):
    """The identity check does not get in the way of the real thing: a live engine is stopped,
    and so are the children of one whose leader died (their group is the leader's own)."""
    run = launch(make_plan(stand_in, "fork"), timeout=60)
    kid = child_pid(run)
    os.kill(run.pid, signal.SIGKILL)  # the leader dies; its forked child lives on in its group
    from sparkit.runs import processes
    from sparkit.runs.processes import reap

    deadline = time.monotonic() + 10
    while run.pid in processes.children:
        reap(run.pid)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not psutil.pid_exists(run.pid) and psutil.pid_exists(kid)
    down = sparkit_cli(sparkit_home, "down", run.id)
    assert down.returncode == 0, down.stderr
    assert f"stopped {run.id}" in down.stderr
    assert group_members(run.pgid) == []


@pytest.mark.slow
@pytest.mark.parametrize("ref", ["", "  "])
def test_a_blank_run_reference_matches_nothing(sparkit_home, stand_in, ref):
    from sparkit.errors import UsageError

    run = launch(make_plan(stand_in), timeout=60)
    try:
        down = sparkit_cli(sparkit_home, "down", ref)
        assert down.returncode == 2 and "empty RUN" in down.stderr
        assert run.live and run.reload().state is RunState.RUNNING
        for command in ("logs", "check"):
            assert sparkit_cli(sparkit_home, command, ref).returncode == 2
        with pytest.raises(UsageError):
            select_run(ref)
    finally:
        stop(run, grace=5)


# -- why an engine died ---------------------------------------------------------------------------


def kill_engine_while_starting(sparkit_home, stand_in, sig=signal.SIGKILL, **plan_changes):
    plan = make_plan(stand_in, "hang")
    for key, value in plan_changes.items():
        setattr(plan, key, value)

    killed = []

    def kill_once_loading(event):  # the stand-in logs its loading lines, then hangs
        if event.phase in ("loading weights", "capturing CUDA graphs", "warming up") and not killed:
            killed.append(list_runs()[-1].pid)
            os.kill(killed[0], sig)

    with pytest.raises(LaunchError) as info:
        launch(plan, on_progress=kill_once_loading, timeout=120)
    return info.value


def test_a_sigkill_is_not_blamed_on_memory_without_the_kernel_saying_so(sparkit_home, stand_in):
    """kill -9 of the engine during start-up: the diagnosis names the signal and what was
    checked for an OOM kill, not "the kernel's OOM killer"."""
    error = kill_engine_while_starting(sparkit_home, stand_in)
    message = str(error)
    assert "the engine exited during start (killed by SIGKILL)" in message
    assert "no OOM kill was recorded" in message and "OOM killer ended" not in message
    assert error.run.failure == "killed by SIGKILL"


OOM_HOG = textwrap.dedent(
    '''
    import os, sys, time
    print("[2026-11-29 10:00:00] server_args={'tp_size': 1}", flush=True)
    with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as f:  # into the limited cgroup
        f.write(str(os.getpid()))
    print("[2026-11-29 10:00:01 TP0] Load weight begin. avail mem=10.00 GB", flush=True)
    hog = []
    while True:
        hog.append(bytearray(8 << 20))  # touched pages: the cgroup's limit is hit for real
        for i in range(0, len(hog[-1]), 4096):
            hog[-1][i] = 1
    '''
)


def test_an_oom_kill_is_blamed_on_memory_with_the_kernels_evidence(sparkit_home, tmp_path):
    """The engine exceeds a real memory cgroup limit and the kernel's OOM killer ends it: now
    the diagnosis says so and quotes the evidence. Needs root and a writable memory cgroup."""
    from pathlib import Path

    root = Path("/sys/fs/cgroup/memory")
    if os.geteuid() != 0 or not (root / "memory.limit_in_bytes").exists():
        pytest.skip("needs root and a cgroup-v1 memory hierarchy to set a limit in")
    group = root / f"sparkit-test-{os.getpid()}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(64 << 20))
        if (group / "memory.memsw.limit_in_bytes").exists():
            (group / "memory.memsw.limit_in_bytes").write_text(str(64 << 20))
    except OSError as exc:
        pytest.skip(f"cannot create a memory cgroup here ({exc.strerror})")
    script = tmp_path / "hog.py"
    script.write_text(OOM_HOG)
    plan = make_plan(script)
    plan.argv = [sys.executable, str(script), str(group)]
    try:
        with pytest.raises(LaunchError) as info:
            launch(plan, timeout=120)
    finally:
        group.rmdir()
    message = str(info.value)
    assert "the engine exited during start (out of memory (OOM killer))" in message, message
    pid = info.value.run.pid
    assert re.search(rf"oom_kill 0 -> 1|kernel log: .*(Killed process {pid}\b|oom-kill:.*pid={pid}\b)", message), message


def test_state_is_private_under_a_permissive_umask(tmp_path, monkeypatch, stand_in):
    """Issue 15: with umask 022 every run file and the chat history were world-readable. Under
    that umask, in a directory every user can enter, sparkit's home, the runs and each file of a
    run (plan, meta, log, checks, activation) are 0700 / 0600; as root, another user (nobody)
    cannot read any of them."""
    import shutil
    import subprocess

    from sparkit.runs.store import RunFiles
    from sparkit.tui.history import ChatStore

    shared = tmp_path / "shared"
    shared.mkdir()
    for directory in (tmp_path, shared):
        directory.chmod(0o755)
    home = shared / "home"
    monkeypatch.setenv("SPARKIT_HOME", str(home))
    old = os.umask(0o022)
    try:
        run = launch(make_plan(stand_in), timeout=60)
        try:
            run.write_json(RunFiles.CHECKS, {"checks": [{"name": "x", "status": "pass"}]})
            store = ChatStore()
            store.close()
        finally:
            stop(run, grace=5)
    finally:
        os.umask(old)
    files = [p for p in home.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {RunFiles.PLAN, RunFiles.META, RunFiles.CHECKS, "server.log", "chat.sqlite3"}
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {oct(0o600)}, files
    dirs = [home, *[p for p in home.rglob("*") if p.is_dir()]]
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in dirs} == {oct(0o700)}, dirs
    if os.geteuid() != 0 or shutil.which("cat") is None:
        return
    for path in files:  # the second user on the box
        denied = subprocess.run(["cat", str(path)], capture_output=True, preexec_fn=lambda: os.setuid(65534))
        assert denied.returncode != 0 and b"Permission denied" in denied.stderr, path


def test_an_engine_started_before_up_recorded_its_pid_is_found_and_stopped(sparkit_home, stand_in):
    """`sparkit up` killed between Popen and writing the pid (a window a loaded machine widens):
    the engine carries its run directory in its environment, so `status` finds it, stops it and
    fails the start as "waiting for the engine to start", not as a build that never launched."""
    import subprocess

    from sparkit.engines.activation_report import REPORT_DIR_ENV
    from sparkit.runs.processes import ProcessIdentity
    from sparkit.runs.store import RunState, list_runs, mark_stale

    run = launch(make_plan(stand_in), timeout=60)
    stop(run, grace=5)
    gone_up = subprocess.Popen([sys.executable, "-c", "pass"])  # the `sparkit up` that was killed
    owner = ProcessIdentity.of(gone_up.pid)
    gone_up.wait()
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                              env={**os.environ, REPORT_DIR_ENV: str(run.path)})
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                                 env={**os.environ, REPORT_DIR_ENV: str(run.path) + "-other"})
    try:
        run.state, run.pid, run.pgid, run.create_time, run.cmdline = RunState.STARTING, None, None, None, None
        run.stopped_at, run.failure, run.owner = None, None, owner.to_dict()
        run.save()
        (stale,) = mark_stale()
        assert stale.id == run.id and stale.state is RunState.FAILED
        assert stale.failure == f"`sparkit up` (pid {gone_up.pid}) ended while waiting for the engine to start"
        assert engine.wait(timeout=30) is not None  # stopped
        assert unrelated.poll() is None  # another run's engine is left alone
        (again,) = [r for r in list_runs() if r.id == run.id]
        assert again.pid == engine.pid and again.state is RunState.FAILED
    finally:
        for proc in (engine, unrelated):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_run_serving_a_recipe_is_found_by_its_settings_whatever_its_port(sparkit_home, stand_in):
    """Issue 39.6: `up` twice of the same recipe started a second server; the first is now found by
    what it serves (engine and resolved recipe, the port aside unless one is asked for)."""
    from sparkit.runs import holder_of_port, run_serving

    plan = make_plan(stand_in)
    plan.recipe = {"model": {"path": "m"}, "server": {"port": plan.port, "host": "127.0.0.1"}}
    same_on_another_port = {"model": {"path": "m"}, "server": {"port": 1, "host": "127.0.0.1"}}
    assert run_serving("embedded", same_on_another_port) is None
    run = launch(plan, timeout=60)
    try:
        assert run_serving("embedded", same_on_another_port).id == run.id
        assert run_serving("embedded", same_on_another_port, port=plan.port).id == run.id
        assert run_serving("embedded", same_on_another_port, port=plan.port + 1) is None
        assert run_serving("embedded", {"model": {"path": "another"}, "server": {"port": 1, "host": "127.0.0.1"}}) is None
        assert run_serving("sglang", same_on_another_port) is None
        assert holder_of_port(plan.port) == (f"sparkit run {run.id} (stand-in, pid {run.pid})", run.reload())
    finally:
        stop(run, grace=5)
    assert run_serving("embedded", same_on_another_port) is None  # stopped: nothing serves it


def test_a_port_clash_names_the_process_that_listens_and_suggests_port_auto(sparkit_home, stand_in):
    import socket

    from sparkit.checks.preflight import check_port
    from sparkit.host import detect_host

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        plan = make_plan(stand_in)
        plan.port = listener.getsockname()[1]
        result = check_port(plan, detect_host())
    me = psutil.Process(os.getpid())
    assert result.status.value == "fail"
    assert result.detail == f"127.0.0.1:{plan.port} is in use, held by pid {me.pid} ({me.name()})"
    assert result.fix.startswith("`--port auto` picks a free port")
