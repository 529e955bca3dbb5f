"""sparkit as a Python library: the names `sparkit/__init__.py` promises, and the documented use of
them against a real server (the embedded engine, started by the same pipeline as `sparkit up`)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import sparkit

REPO = Path(__file__).resolve().parents[1]


def test_every_public_name_resolves_and_the_version_is_the_packages():
    for name in sparkit.__all__:
        assert getattr(sparkit, name) is not None, name
    assert sparkit.__version__ == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert issubclass(sparkit.RecipeError, sparkit.SparkitError)


def test_importing_sparkit_imports_nothing_heavy():
    code = ("import sys, sparkit; sparkit.load_recipe; sparkit.compile_plan; "
            "print(sorted(m for m in ('torch', 'sglang', 'textual', 'scipy', 'starlette') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


@pytest.mark.slow
def test_load_compile_start_check_talk_stop(sparkit_home):
    loaded = sparkit.load_recipe("tiny")
    from sparkit.runs import free_port

    plan = sparkit.compile_plan(loaded, port=free_port())
    with sparkit.transient_server(plan, checks=True) as started:
        assert started.ok, [(r.name, r.detail) for r in started.failed_checks]
        assert {r.name for r in started.checks} >= {"lm_head_dtype", "shared_lm_head", "acceptance", "known_answer"}
        assert next(r for r in started.checks if r.name == "known_answer").status is sparkit.Status.PASS
        assert sparkit.select_run(plan.recipe_name).id == started.run.id

        async def ask() -> str:
            async with sparkit.EngineClient(started.server.url, api_key=started.server.api_key) as client:
                return (await client.generate("count: one two", sampling_params={"temperature": 0, "max_new_tokens": 4})).text

        assert asyncio.run(ask())
    assert started.run.reload().state is sparkit.RunState.STOPPED and not started.run.live
