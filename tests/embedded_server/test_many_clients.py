"""64 streaming clients against a server that decodes 4 at a time, served in this process through
the client's transport seam (the real app, engine, worker thread and scheduler): /health answers
200 throughout, and the event loop's share of the work grows with the batch, not with the clients: the worker hands the loop at most one update per
running stream per step (what waits costs the loop nothing). Counted, never timed."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from sparkit.engines.embedded.routes import create_app
from sparkit.engines.embedded.server import build_server

pytestmark = pytest.mark.slow

CLIENTS, RUNNING, TOKENS = 64, 4, 12


@pytest.fixture
def server(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKIT_REPORT_DIR", str(tmp_path))
    state = build_server(["--model-path", str(tiny_model_dir), "--device", "cpu", "--torch-threads", "1",
                          "--max-running-requests", str(RUNNING)])
    state.worker.start()
    for _ in range(6000):  # loads and warms up in its thread; bounded by steps, not by a clock
        if state.worker.state in ("ready", "failed"):
            break
        time.sleep(0.05)
    assert state.worker.state == "ready"
    yield state
    state.close_grammar_pool()
    state.worker.stop()
    state.worker.thread.join(timeout=10)


def test_health_answers_under_64_clients_and_the_loop_s_work_grows_with_the_batch(server):
    app = create_app(server)

    async def go():
        loop = asyncio.get_running_loop()
        handed = {"n": 0}
        original = loop.call_soon_threadsafe

        def counted(*args, **kwargs):  # every callback the engine's worker thread hands this loop
            if threading.current_thread() is server.worker.thread:
                handed["n"] += 1
            return original(*args, **kwargs)

        loop.call_soon_threadsafe = counted
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://in-process", timeout=600) as http:
            async def client(i: int):
                body = {"text": f"count: {i}", "stream": True,
                        "sampling_params": {"temperature": 0.0, "max_new_tokens": TOKENS, "ignore_eos": True}}
                return await http.post("/generate", json=body)

            tasks = [asyncio.create_task(client(i)) for i in range(CLIENTS)]
            health = []
            while not all(task.done() for task in tasks):
                health.append((await http.get("/health")).status_code)
            return [task.result() for task in tasks], health, handed["n"]

    responses, health, handed = asyncio.run(go())
    assert len(health) >= 1 and set(health) == {200}
    finals = []
    for response in responses:
        assert response.status_code == 200
        events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
        finals.append(events[-1]["meta_info"])
    assert all(meta["completion_tokens"] == TOKENS for meta in finals)
    steps = server.worker.scheduler.decode_steps
    assert steps >= CLIENTS * (TOKENS - 1) // RUNNING  # 4 at a time
    # per step at most one update per running stream; besides, per client its first token and its end
    assert handed <= steps * RUNNING + CLIENTS * 2, f"{handed} updates for {steps} steps of {RUNNING} streams"
