"""`sparkit up` of a recipe whose model is a hub id: refused with the exact pull command while the
model is not here (nothing downloaded), or with --pull pulled first with the same progress, then
the engine (the embedded engine, a real process) is started on the local snapshot with
HF_HUB_OFFLINE=1, so it never downloads inside a launch. The token of a gated repository works and
is written nowhere: not in a file, an argv, a log, a plan.json or a run directory."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from _hub import TOKEN, commit, run_sparkit, served_files


def hub_recipe(tmp_path: Path, repo: str) -> Path:
    recipe = tmp_path / "hub-tiny.yaml"
    # tiny, on the same weights pulled from the hub (its HF export): the known-answer check too
    recipe.write_text(f"extends: tiny\nmodel:\n  path: {repo}\n")
    return recipe


@pytest.mark.slow
def test_up_refuses_a_hub_model_that_is_not_here_with_the_exact_pull_command(hub, hub_env, tmp_path):
    recipe = hub_recipe(tmp_path, "sparkit-test/tiny-ling@v0")
    done = run_sparkit(hub_env, "up", str(recipe), "--port", "auto", "--detach")
    assert done.returncode == 4, done.stderr
    text = " ".join(done.stderr.split())
    assert "error: preflight failed: model: sparkit-test/tiny-ling@v0 (target) is not here" in text
    assert "hint: `sparkit pull sparkit-test/tiny-ling@v0` (or `sparkit up --pull ...` pulls it first)" in text
    # Nothing was downloaded, by sparkit or an engine: the preflight's memory fit read config.json
    # and the weights' header (a 100 kB range), no more.
    served = served_files(hub, "sparkit-test/tiny-ling")
    assert set(served) <= {"config.json", "model.safetensors"} and served.get("model.safetensors", 0) <= 100_000
    assert not any(p.info["cmdline"] and "sparkit.engines.embedded" in " ".join(p.info["cmdline"])
                   and str(tmp_path) in " ".join(p.info["cmdline"]) for p in psutil.process_iter(["cmdline"]))


def test_up_of_a_hub_model_the_hub_cannot_describe_says_what_serves_it_and_the_pull_for_a_tiny_ling_export(hub, hub_env, tmp_path):
    # Offline, the embedded engine cannot tell what the hub model is: it names the engine that
    # serves other models and, should it be tiny-ling's export, the pull.
    recipe = hub_recipe(tmp_path, "sparkit-test/tiny-ling@v0")
    done = run_sparkit({**hub_env, "HF_HUB_OFFLINE": "1"}, "up", str(recipe), "--port", "auto", "--detach")
    assert done.returncode == 4, done.stderr
    text = " ".join(done.stderr.split())
    assert "error: preflight failed: model: sparkit-test/tiny-ling@v0: not a local directory, and the embedded engine downloads nothing" in text
    assert "hint: SGLang serves it (engine: sglang" in text and "a tiny-ling export on the hub: `sparkit pull sparkit-test/tiny-ling@v0` first" in text
    assert served_files(hub, "sparkit-test/tiny-ling") == {}


@pytest.mark.slow
def test_up_pull_pulls_then_serves_the_local_snapshot_offline_and_the_token_is_written_nowhere(hub, hub_env, tmp_path):
    repo = "sparkit-test/tiny-ling-gated"
    env = {**hub_env, "HF_TOKEN": TOKEN}
    recipe = hub_recipe(tmp_path, repo)
    done = run_sparkit(env, "up", str(recipe), "--pull", "--port", "auto", "--detach", "--json", timeout=900)
    try:
        assert done.returncode == 0, done.stderr[-4000:]
        report = json.loads(done.stdout)
        assert report["ok"], report["checks"]
        assert "ok      sparkit-test/tiny-ling-gated: model.safetensors" in done.stderr  # the pull's own progress
        snapshot = Path(env["HF_HUB_CACHE"]) / f"models--{repo.replace('/', '--')}" / "snapshots" / commit(f"{repo}@main")
        run_dir = Path(report["log"]).parent
        plan = json.loads((run_dir / "plan.json").read_text())
        argv = plan["argv"]
        assert argv[argv.index("--model-path") + 1] == str(snapshot)
        assert plan["env"]["HF_HUB_OFFLINE"] == "1"
        (pulled,) = plan["model_pulls"]
        assert pulled["local"] == str(snapshot) and pulled["state"] == "verified"
        engine = psutil.Process(report["pid"])
        assert engine.environ().get("HF_HUB_OFFLINE") == "1"
        assert str(snapshot) in engine.cmdline() and TOKEN not in " ".join(engine.cmdline())
        status = json.loads(run_sparkit(env, "status", "--json").stdout)["runs"]
        assert [r["id"] for r in status if r["state"] == "running"] == [report["run"]]
        # The served name is the recipe's (tiny-ling), the model the hub's weights: the known answer passed.
        assert next(c for c in report["checks"] if c["name"] == "known_answer")["status"] == "pass"
        served = served_files(hub, repo)
    finally:
        run_sparkit(env, "down", "--all")
    assert TOKEN not in done.stdout and TOKEN not in done.stderr
    for path in tmp_path.rglob("*"):  # runs, logs, plan.json, the HF cache, sparkit's cache
        if path.is_file() and not path.is_symlink():
            assert TOKEN.encode() not in path.read_bytes(), path
    again = run_sparkit(env, "plan", str(recipe), "--json")
    assert json.loads(again.stdout)["model_pulls"][0]["state"] == "verified"
    assert served_files(hub, repo) == served
