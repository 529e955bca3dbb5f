"""Issue 29, item 8 (chat): a signal to `sparkit chat` mid-reply, on a real terminal (a pty), against
a real server. It printed two tracebacks, exited 0, and stored the partial reply (11 tokens on
screen) as an empty message. Now: the reply is stored as far as it came, marked interrupted,
nothing is printed over the screen but one line saying so, and the command exits 130
(interrupted, as every sparkit command)."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from sparkit.tui.history import ChatStore

pytestmark = pytest.mark.e2e

WAIT_S = 180.0
STREAMING = re.compile(rb"(\d+) tok \xc2\xb7 streaming")  # the metrics bar while a reply streams


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_mid_reply_keeps_the_partial_reply_and_exits_130(start_embedded_server, tmp_path, sig):
    server = start_embedded_server(debug_step_delay_ms=200)  # a reply of ~50 tokens takes 10 s and more
    home = tmp_path / "home"
    env = {**os.environ, "SPARKIT_HOME": str(home), "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "sparkit", "chat", "--url", server.url],
                            stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True, start_new_session=True)
    os.close(slave)
    drawn = b""

    def read_for(seconds: float) -> None:
        nonlocal drawn
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    drawn += os.read(master, 65536)
                except OSError:
                    return

    try:
        deadline = time.monotonic() + WAIT_S
        while b"online" not in drawn and time.monotonic() < deadline:
            read_for(0.5)
        assert b"online" in drawn, drawn[-2000:]
        os.write(master, b"hello\r")
        seen = 0
        while seen < 6 and time.monotonic() < deadline and proc.poll() is None:
            read_for(0.3)
            counts = [int(n) for n in STREAMING.findall(drawn)]
            seen = max(counts, default=0)
        assert seen >= 6, drawn[-3000:]
        os.kill(proc.pid, sig)
        code = proc.wait(timeout=60)
        read_for(0.5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    text = drawn.decode("utf-8", "replace")
    assert code == 130, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    store = ChatStore(home / "data" / "chat.sqlite3")
    try:
        (chat,) = store.list_conversations()
        reply = store.load(chat.id).messages[-1]
    finally:
        store.close()
    assert reply.role == "assistant" and reply.status == "interrupted"
    assert reply.content.strip(), "the partial reply was stored empty"
    assert reply.metrics and reply.metrics["output_tokens"] >= 6
    if sig != signal.SIGHUP:  # after SIGHUP there is no terminal to say it on
        assert f"interrupted ({signal.Signals(sig).name}): the chat is saved" in " ".join(text.split())
