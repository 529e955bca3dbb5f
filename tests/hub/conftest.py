"""Fixtures of the pull tests: the local hub (tests/_hub.py, tests/hub_server.py) and the
environment of a `sparkit` process that talks to it."""

from __future__ import annotations

import os

import pytest

from _hub import Hub, Pulling, build_repos, start_hub


@pytest.fixture(scope="session")
def hub_repos(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    return build_repos(tmp_path_factory.mktemp("hub"), tmp_path_factory.mktemp("exports"))


@pytest.fixture(scope="session")
def hub_server(hub_repos):
    hub = start_hub(hub_repos)
    yield hub
    hub.proc.terminate()
    hub.proc.wait(timeout=30)


@pytest.fixture
def hub(hub_server) -> Hub:
    """The session's hub with no fault and fresh counters (and no pull a failed test left running)."""
    hub_server.control(op="reset")
    yield hub_server
    while Pulling.started:
        pulling = Pulling.started.pop()
        if pulling.proc.poll() is None:
            pulling.proc.kill()
            pulling.proc.wait(timeout=60)
    hub_server.control(op="reset")


@pytest.fixture
def hub_env(hub, tmp_path) -> dict:
    """The environment of a `sparkit` process that talks to the local hub: its own Hugging Face
    cache and home (no token file), its own SPARKIT_HOME, online."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_OFFLINE"))}
    env.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "hf" / "hub"), HF_HOME=str(tmp_path / "hf"),
               SPARKIT_HOME=str(tmp_path / "home"), COLUMNS="200", HF_HUB_DISABLE_TELEMETRY="1")
    env.pop("SPARKIT_DEBUG", None)
    return env
