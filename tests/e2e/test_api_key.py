"""Which API key an engine enforces and which one sparkit's clients send (sparkit.api_key):
real `sparkit` processes starting real embedded-engine servers, asked over HTTP.

The bug these pin: `SPARKIT_API_KEY` exported in the shell (the variable the client commands
read for a `--url` server) reached the engine of a recipe that names no key, which then enforced
it and failed its own startup checks with 401s (exit 6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import psutil
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _models_status(url: str, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(url.rstrip("/") + "/v1/models", headers=headers, timeout=30).status_code


def _sparkit(home, shell: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`sparkit ARGS` in a shell that exports `shell` (and no key variable otherwise)."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARKIT_API_KEY", "MY_SERVER_KEY")}
    env.update({"SPARKIT_HOME": str(home), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **shell})
    return subprocess.run([sys.executable, "-m", "sparkit", *args], env=env, capture_output=True, text=True, timeout=300)


def _checks(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["checks"]}


def _down(home, doc: dict) -> None:
    down = _sparkit(home, {}, "down", doc["run"])
    assert down.returncode == 0, down.stderr
    deadline = time.monotonic() + 15
    while psutil.pid_exists(doc["pid"]) and psutil.Process(doc["pid"]).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the engine outlived `sparkit down`"
        time.sleep(0.1)


def test_an_exported_key_does_not_reach_an_engine_whose_recipe_names_none(sparkit_home):
    shell = {"SPARKIT_API_KEY": "x"}
    up = _sparkit(sparkit_home, shell, "up", "--detach", "--port", "auto", "--json")  # the default recipe: tiny
    assert up.returncode == 0, up.stderr[-3000:]
    doc = json.loads(up.stdout)
    try:
        assert doc["ok"] is True
        failed = {n: c for n, c in _checks(doc).items() if c["status"] == "fail"}
        assert failed == {}
        assert _models_status(doc["url"], None) == 200  # the engine enforces no key
        status = _sparkit(sparkit_home, shell, "status", "--json")
        assert status.returncode == 0 and json.loads(status.stdout)["runs"][0]["healthy"] is True
        again = _sparkit(sparkit_home, shell, "check", doc["run"], "--json")
        assert again.returncode == 0, again.stderr[-3000:]
    finally:
        _down(sparkit_home, doc)


def test_a_recipe_that_names_a_key_has_its_engine_enforce_it_and_its_clients_send_it(sparkit_home):
    # SPARKIT_API_KEY holds another key: for a run sparkit started, the recipe's variable wins.
    shell = {"MY_SERVER_KEY": "sesame", "SPARKIT_API_KEY": "not-the-key"}
    up = _sparkit(sparkit_home, shell, "up", "--set", "server.api_key_env=MY_SERVER_KEY",
                  "--detach", "--port", "auto", "--json")
    assert up.returncode == 0, up.stderr[-3000:]
    doc = json.loads(up.stdout)
    try:
        assert doc["ok"] is True
        assert _models_status(doc["url"], None) == 401
        assert _models_status(doc["url"], "not-the-key") == 401
        assert _models_status(doc["url"], "sesame") == 200
        status = _sparkit(sparkit_home, shell, "status", "--json")
        assert status.returncode == 0 and json.loads(status.stdout)["runs"][0]["healthy"] is True
        again = _sparkit(sparkit_home, shell, "check", doc["run"], "--json")
        assert again.returncode == 0, again.stderr[-3000:]
        # The option given on the command line wins over the recipe's variable: a wrong one is refused.
        wrong = _sparkit(sparkit_home, shell, "check", doc["run"], "--api-key", "wrong", "--json")
        assert wrong.returncode != 0
    finally:
        _down(sparkit_home, doc)
