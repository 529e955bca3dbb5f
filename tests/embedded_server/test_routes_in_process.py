"""The embedded server's routes served in this process through the client's transport seam
(httpx.ASGITransport): the same app, engine and worker thread a real server runs, without a
port or a process (tests/e2e keeps the ones that start real servers)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from sparkit.client import EngineClient
from sparkit.engines.embedded.routes import create_app
from sparkit.engines.embedded.server import build_server
from sparkit.errors import EngineError


@pytest.fixture(scope="module")
def in_process(tiny_model_dir, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("SPARKIT_REPORT_DIR", str(tmp_path_factory.mktemp("reports")))
    state = build_server(["--model-path", str(tiny_model_dir), "--device", "cpu", "--torch-threads", "1",
                          "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                          "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
                          "--lm-head-dtype", "fp8"])
    state.worker.start()
    for _ in range(6000):  # loads and warms up in its thread; bounded by steps, not by a clock
        if state.worker.state in ("ready", "failed"):
            break
        time.sleep(0.05)
    assert state.worker.state == "ready"
    yield state, create_app(state)
    state.worker.stop()
    state.worker.thread.join(timeout=10)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def client(app) -> EngineClient:
    return EngineClient("http://in-process", transport=httpx.ASGITransport(app=app))


def test_generate_and_server_info_through_the_transport_seam(in_process):
    state, app = in_process

    async def go():
        async with client(app) as c:
            assert await c.health()
            info = await c.server_info()
            out = await c.generate("count: one two", sampling_params={"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True})
            metrics = await c.metrics()
            return info, out, metrics

    info, out, metrics = asyncio.run(go())
    assert info["speculative_algorithm"] == "NEXTN" and info["speculative_num_draft_tokens"] == 4
    assert info["lm_head_dtype"] == "fp8" and info["moe_runner_backend"] == "embedded-torch"
    assert out.completion_tokens == 8 and out.text
    assert out.accept_length is not None and out.accept_length >= 1.0
    assert metrics["sglang:generation_tokens_total"] >= 8


def test_an_unknown_model_is_the_openai_shaped_404(in_process):
    _, app = in_process

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://in-process") as http:
            return await http.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]})

    response = asyncio.run(go())
    assert response.status_code == 404
    body = response.json()  # SGLang's flat ErrorResponse
    assert body["object"] == "error" and body["param"] == "model" and "tiny-ling" in body["message"] and body["code"] == 404


def test_the_client_reports_an_engine_error_as_such(in_process):
    _, app = in_process

    async def go():
        async with client(app) as c:
            await c.generate("x" * 5000, sampling_params={"max_new_tokens": 1})

    with pytest.raises(EngineError) as info:
        asyncio.run(go())
    assert "context length" in str(info.value)
