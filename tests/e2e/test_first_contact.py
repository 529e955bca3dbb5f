"""What a first-time user meets around `up`: a model the embedded engine cannot serve, a GPU
recipe on a CPU host, two servers and `down`, the log of a stopped run, the status figures'
source, Ctrl-C during a start, `sparkit run`, and `chat` with no server. Real `sparkit`
processes; servers are real embedded engines."""

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

from sparkit.host import detect_host

from _shared import ANSI


def env_for(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "SPARKIT_HOME": str(home), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("COLUMNS", None)
    env.update(extra)
    return env


def sparkit(home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkit", *args], env=env_for(home), capture_output=True,
                          text=True, timeout=timeout)


def words(text: str) -> str:
    return " ".join(text.split())


# Runs a sparkit command and reports on the last stderr line whether sglang's parser was imported.
_REPORTING = """
import sys
from sparkit.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
sys.stderr.write("\\nimported-server-args=%s\\n" % ("sglang.srt.server_args" in sys.modules))
sys.exit(code)
"""


@pytest.mark.skipif(bool(detect_host().gpus), reason="a host with GPUs may fit the recipe's target")
def test_a_gpu_recipe_on_a_cpu_host_fails_preflight_before_the_engines_parser_is_imported(tmp_path):
    done = subprocess.run([sys.executable, "-c", _REPORTING, "up", "ling-3.0-flash/spark-optimized", "--port", "auto"],
                          env=env_for(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 4, done.stderr
    assert "preflight failed: GPUs: target gb10: needs 1 GPU(s), found 0" in words(done.stderr)
    assert done.stderr.rstrip().endswith("imported-server-args=False")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing was started


def test_a_hub_model_on_the_embedded_engine_fails_preflight_saying_what_serves_it(tmp_path):
    done = sparkit(tmp_path, "up", "--set", "model.path=Qwen/Qwen2.5-0.5B-Instruct", "--port", "auto")
    assert done.returncode == 4, done.stderr
    text = words(done.stderr)
    assert "model: Qwen/Qwen2.5-0.5B-Instruct: not a local directory, and the embedded engine downloads nothing" in text
    assert "it serves tiny-ling only" in text
    assert 'hint: SGLang serves it (engine: sglang' in text and "`sparkit up qwen2.5-0.5b-instruct.yaml`" in text
    assert "broken checkpoint" not in text and "model build" not in text
    plan = sparkit(tmp_path, "plan", "tiny", "--set", "model.path=Qwen/Qwen2.5-0.5B-Instruct")
    assert plan.returncode == 0 and "`sparkit up` refuses it" in words(plan.stderr)


def test_another_models_checkpoint_on_the_embedded_engine_names_its_architecture(tmp_path):
    model = tmp_path / "qwen"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}))
    done = sparkit(tmp_path, "up", "--set", f"model.path={model}", "--port", "auto")
    assert done.returncode == 4, done.stderr
    assert "a model of architecture Qwen2ForCausalLM" in words(done.stderr)


@pytest.mark.slow
def test_recipes_validate_without_an_argument_validates_every_shipped_recipe(tmp_path):
    from sparkit.recipes.load import shipped_recipes

    done = sparkit(tmp_path, "recipes", "validate", "--json")
    assert done.returncode == 0, done.stderr
    checked = [r["recipe"] for r in json.loads(done.stdout)]
    assert checked == [name for name, _ in shipped_recipes()] and len(checked) >= 15
    assert f"validating the {len(checked)} shipped recipes" in done.stderr


def test_recipes_validate_without_an_argument_fails_on_a_broken_shipped_recipe(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import sparkit.cli.commands.recipes as recipes_cmd
    from sparkit.cli.main import app

    broken = tmp_path / "broken.yaml"
    broken.write_text("model:\n  path: org/model\nstack:\n  lm_head: fp16\n")
    good = tmp_path / "good.yaml"
    good.write_text("engine: embedded\nmodel:\n  path: 'sparkit:tiny-ling'\n")
    monkeypatch.setattr(recipes_cmd, "_shipped", lambda: [(str(good), good), (str(broken), broken)])
    result = CliRunner().invoke(app, ["recipes", "validate", "--json"])
    assert result.exit_code == 3
    rows = json.loads(result.stdout)
    assert [(r["recipe"], r["ok"]) for r in rows] == [(str(good), True), (str(broken), False)]
    assert "stack.lm_head" in rows[1]["error"]


# ------------------------------------------------------------------ with real servers


def up_detached(home: Path, *extra: str) -> dict:
    done = sparkit(home, "up", "--detach", "--port", "auto", "--json", *extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def engine_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.e2e
def test_two_servers_down_says_what_it_left_and_logs_names_the_stopped_run(tmp_path):
    first = up_detached(tmp_path)
    second = up_detached(tmp_path, "tiny/tiny-baseline")
    try:
        status = sparkit(tmp_path, "status")
        assert status.returncode == 0 and first["run"] in status.stdout and second["run"] in status.stdout
        assert "tok/s and accept: the startup probe's" in words(status.stderr)  # what the figures are
        assert json.loads(sparkit(tmp_path, "status", "--json").stdout)["runs"][0]["figures_from"] == "startup probe"

        down = sparkit(tmp_path, "down")  # the latest: the second
        assert down.returncode == 0, down.stderr
        text = words(down.stderr)
        assert f"stopped {second['run']}" in text
        assert f"left running: {first['run']} ({first['url']})" in text and "`sparkit down --all`" in text
        assert engine_alive(first["pid"]) and not engine_alive(second["pid"])
        logs = sparkit(tmp_path, "logs")  # the live one: no note needed
        assert logs.returncode == 0 and "the log of run" not in logs.stderr
    finally:
        all_down = sparkit(tmp_path, "down", "--all")
    assert all_down.returncode == 0 and "left running" not in all_down.stderr
    logs = sparkit(tmp_path, "logs")
    assert logs.returncode == 0 and "Load weight" in logs.stdout
    assert f"no server is running; the log of run {second['run']} (tiny/tiny-baseline, stopped 20" in words(logs.stderr)
    assert logs.stderr.strip().endswith("server.log")


@pytest.mark.e2e
def test_ctrl_c_during_a_start_says_it_is_stopping_and_leaves_nothing(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "sparkit", "up", "--port", "auto"], env=env_for(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = tmp_path / "runs"
    deadline = time.monotonic() + 300
    pid = None
    while time.monotonic() < deadline and pid is None:  # the engine has started: the run records its pid
        time.sleep(0.2)
        for meta in runs.glob("*/meta.json") if runs.exists() else []:
            try:
                pid = json.loads(meta.read_text()).get("pid")
            except ValueError:
                continue
    assert pid is not None, "the engine never started"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    text = words(ANSI.sub("", err))
    assert "interrupted: stopping the engine ..." in text and "stopped; nothing is left running" in text
    assert text.index("interrupted: stopping the engine") < text.index("stopped; nothing is left running")
    assert not engine_alive(pid)


def drive_on_a_pty(args: list[str], home: Path, answer_at: dict[bytes, bytes], timeout: float = 300) -> tuple[int, str]:
    """Run sparkit on a real terminal; when the screen shows a key of `answer_at`, type its value."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "sparkit", *args], env=env_for(home, TERM="xterm-256color"),
                            stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    seen, pending = b"", dict(answer_at)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    seen += os.read(master, 65536)
                except OSError:
                    break
            for cue in list(pending):
                if cue in seen:
                    time.sleep(1.0)
                    os.write(master, pending.pop(cue))
        code = proc.wait(timeout=120)
        try:
            while select.select([master], [], [], 0.2)[0]:
                seen += os.read(master, 65536)
        except OSError:
            pass
        return code, ANSI.sub("", seen.decode(errors="replace"))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


@pytest.mark.e2e
def test_run_brings_the_recipe_up_opens_the_chat_and_stops_the_server_after(tmp_path):
    code, screen = drive_on_a_pty(["run"], tmp_path, {b"Message": b"\x11"})  # Ctrl+Q once the chat is up
    assert code == 0, screen[-3000:]
    assert "startup checks" in screen and "stopped run tiny-" in screen
    runs = [json.loads(m.read_text()) for m in (tmp_path / "runs").glob("*/meta.json")]
    assert len(runs) == 1 and runs[0]["state"] in ("stopped", "exited") and not engine_alive(runs[0]["pid"])


def test_chat_with_no_server_asks_on_a_terminal_and_is_exit_7_elsewhere(tmp_path):
    code, screen = drive_on_a_pty(["chat"], tmp_path, {b"start it": b"n\r"}, timeout=120)
    assert code == 7 and "no server is running. Start the default recipe" in " ".join(screen.split())
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    piped = sparkit(tmp_path, "chat")
    assert piped.returncode == 7 and "no running server found" in piped.stderr and "start it" not in piped.stderr
