"""The README's tour, every line, in a fresh clone outside this checkout's folder (no ../shared
there), offline, with the installed environment: each line exits as the README documents.

The lines are read from the clone's own README, so the test follows the README. Three changes
keep it a test, not a benchmark: `up` gets `--port auto` (another server may hold 30000), counts
are cut (questions, prompts, kinds; each command still does every step it documents), and `chat`,
a full-screen program, is started on a real pseudo-terminal and quit with Ctrl+Q.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _shared import ANSI, REPO_DIR

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]

# Smaller counts per command (the tour's own flags stay; these are appended, and win).
SMALLER = {
    ("eval", "gsm8k"): ["--limit", "4", "--max-tokens", "64"],
    ("bench",): ["--num-prompts", "2", "--input-len", "64", "--output-len", "32"],
    ("tune",): ["--num-prompts", "2", "--warmup", "0"],
    ("bench", "profile"): ["--kinds", "chat,math", "--prompts", "2"],
    ("bench", "steps"): ["--steps", "8"],
    ("verify",): ["--num-prompts", "2", "--max-new-tokens", "32"],
}


def tour_lines(readme: str) -> list[str]:
    section = readme.split("## A tour", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.strip().splitlines() if line.strip()]


def argv_of(line: str) -> list[str]:
    words = shlex.split(line)
    assert words[0] == "sparkit", line
    words = words[1:]
    if words[:1] == ["up"]:
        words += ["--port", "auto"]
    for prefix, extra in sorted(SMALLER.items(), key=lambda kv: -len(kv[0])):
        if tuple(words[: len(prefix)]) == prefix:
            return words + extra
    return words


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tour")
    clone = root / "sparkit"
    subprocess.run(["git", "clone", "-q", str(REPO_DIR), str(clone)], check=True, timeout=300)
    assert not (clone.parent / "shared").exists() and REPO_DIR.parent not in clone.parents
    return clone


def environment(clone: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARKIT_SHARED_DIR", "SPARKIT_GSM8K", "COLUMNS")}
    # The clone's sparkit, in the installed environment; no network for data.
    env.update({"SPARKIT_HOME": str(clone.parent / "home"), "PYTHONPATH": str(clone), "HF_HUB_OFFLINE": "1",
                "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    return env


def sparkit(clone: Path, args: list[str], timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkit", *args], cwd=clone, env=environment(clone),
                          capture_output=True, text=True, timeout=timeout)


def chat_on_a_pty(clone: Path) -> tuple[int, str]:
    """`sparkit chat` on a real terminal: wait for its prompt, quit with Ctrl+Q."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "sparkit", "chat"], cwd=clone, env={**environment(clone), "TERM": "xterm-256color"},
                            stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    seen, sent = b"", False
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    seen += os.read(master, 65536)
                except OSError:
                    break
            if not sent and b"Message" in seen:
                time.sleep(1.0)
                os.write(master, b"\x11")  # Ctrl+Q
                sent = True
        return proc.wait(timeout=60), ANSI.sub("", seen.decode(errors="replace"))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


def test_every_tour_line_runs_as_written_in_a_fresh_clone_anywhere(clone):
    lines = tour_lines((clone / "README.md").read_text())
    assert len(lines) >= 15 and lines[-1] == "sparkit down --all"
    assert not any("../shared" in line or "--data" in line for line in lines)
    before = set(subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout.splitlines())
    outcome: dict[str, subprocess.CompletedProcess] = {}
    for line in lines:
        args = argv_of(line)
        if args == ["chat"]:
            code, screen = chat_on_a_pty(clone)
            assert code == 0 and "startup checks" in screen and "Message" in screen, screen[-2000:]
            continue
        if args[:2] == ["logs", "-f"]:  # follows until Ctrl-C: exit 130, the log shown first
            proc = subprocess.Popen([sys.executable, "-m", "sparkit", *args], cwd=clone, env=environment(clone),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            # Ctrl-C once the log is on screen (following), however long a loaded machine took to
            # get there: a signal during the imports would test Python's default, not sparkit's.
            shown = b""
            deadline = time.monotonic() + 120
            while b"Load weight" not in shown and time.monotonic() < deadline and proc.poll() is None:
                if select.select([proc.stdout], [], [], 0.5)[0]:
                    shown += os.read(proc.stdout.fileno(), 65536)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 130, err[-2000:]
            assert "Load weight" in (shown + out).decode(errors="replace"), (shown + out)[-2000:]
            continue
        done = sparkit(clone, args)
        outcome[line] = done
        assert done.returncode == 0, f"`{line}` exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr and "internal error" not in done.stderr, line

    def ran(prefix: str) -> subprocess.CompletedProcess:
        return next(done for line, done in outcome.items() if line.startswith(prefix))

    # What the README says each shows.
    assert "shipped with sparkit" in " ".join(ran("sparkit eval gsm8k").stderr.split())
    assert "questions" in ran("sparkit eval gsm8k").stdout
    tune_err = ran("sparkit tune").stderr
    assert "workload: profile:mixed, 48 tokens in / 64 out" in " ".join(tune_err.split())
    said = tune_err.index("writes: the best point's recipe as a new file")
    assert said < tune_err.index("start num_steps=1")  # said before the first server starts
    assert "the startup probe's" in ran("sparkit status").stderr
    # The only file the tour leaves in the checkout is the one tune said it would write.
    after = set(subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout.splitlines())
    new = sorted(after - before)
    assert len(new) == 1 and re.fullmatch(r"\?\? tiny-tuned-num_steps\d\.yaml", new[0]), new
    assert str(clone) in " ".join(tune_err.split())
    # Nothing left running.
    status = sparkit(clone, ["status", "--json"])
    assert status.returncode == 0 and '"runs": []' in status.stdout
