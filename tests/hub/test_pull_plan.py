"""What a plan does with a hub model (no server: the Hugging Face cache is written here as
huggingface_hub lays it out): the engine gets the local snapshot, the hub id as served name and
HF_HUB_OFFLINE=1 once the model is complete here; until then the hub id (and --revision) for the
plan to show, and a preflight that refuses with the pull command. A snapshot another tool
downloaded is used, with a warning that sparkit has not verified it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkit.checks.preflight import check_model
from sparkit.contract.checks import Status
from sparkit.host import Host
from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import load_recipe

from _checkpoints import write_safetensors

COMMIT = "c0ffee" * 6 + "c0ff"


def fake_download(cache: Path, repo: str, *, shards: bool = True, complete: bool = True) -> Path:
    """A snapshot as `huggingface-cli download` leaves one: blobs, relative symlinks, refs/main."""
    root = cache / ("models--" + repo.replace("/", "--"))
    blobs, snapshot = root / "blobs", root / "snapshots" / COMMIT
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    files = {"config.json": json.dumps({"architectures": ["X"], "num_hidden_layers": 1}).encode()}
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"] if shards else ["model.safetensors"]
    if shards:
        files["model.safetensors.index.json"] = json.dumps({"weight_map": {"a": names[0], "b": names[1]}}).encode()
    for i, name in enumerate(names if complete else names[:1]):
        path = blobs / f"{i:064x}"
        write_safetensors(path, {"ab"[i]: ("BF16", (4, 4))})
        (snapshot / name).symlink_to(f"../../blobs/{path.name}")
    for i, (name, data) in enumerate(files.items()):
        (blobs / f"{i + 10:040x}").write_bytes(data)
        (snapshot / name).symlink_to(f"../../blobs/{i + 10:040x}")
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_a_complete_download_is_what_sglang_loads_offline_with_the_hub_id_as_its_name(cache):
    snapshot = fake_download(cache, "inclusionAI/Ling-3.0-flash-fp4")
    plan = compile_plan(load_recipe("ling-3.0-flash/spark-optimized", ["model.served_name=null"]))
    assert flag(plan.argv, "--model-path") == str(snapshot)
    assert flag(plan.argv, "--served-model-name") == "inclusionAI/Ling-3.0-flash-fp4" == plan.served_model_name
    assert plan.env["HF_HUB_OFFLINE"] == "1" and "--revision" not in plan.argv
    (pull,) = plan.model_pulls
    assert pull["state"] == "unverified" and pull["local"] == str(snapshot)
    model = check_model(plan, Host())
    assert model.status == Status.WARN and "`sparkit pull --check inclusionAI/Ling-3.0-flash-fp4`" in model.fix
    named = compile_plan(load_recipe("ling-3.0-flash/spark-optimized"))
    assert flag(named.argv, "--served-model-name") == "ling-3.0-flash"  # the recipe's own name wins
    kept = compile_plan(load_recipe("ling-3.0-flash/spark-optimized", ["server.env.HF_HUB_OFFLINE=0"]))
    assert kept.env["HF_HUB_OFFLINE"] == "0"  # a recipe that says otherwise is obeyed


def test_an_incomplete_download_is_not_loaded_and_the_launch_is_refused_with_the_pull_command(cache):
    fake_download(cache, "inclusionAI/Ling-3.0-flash-fp4", complete=False)
    plan = compile_plan(load_recipe("ling-3.0-flash/spark-optimized"))
    assert flag(plan.argv, "--model-path") == "inclusionAI/Ling-3.0-flash-fp4" and "HF_HUB_OFFLINE" not in plan.env
    (pull,) = plan.model_pulls
    assert pull["state"] == "incomplete" and "model-00002-of-00002.safetensors" in pull["detail"]
    model = check_model(plan, Host())
    assert model.status == Status.FAIL and model.fix.startswith("`sparkit pull inclusionAI/Ling-3.0-flash-fp4`")


def test_a_revision_reaches_sglang_as_its_own_flag_until_pulled(cache):
    plan = compile_plan(load_recipe("ling-3.0-flash/tp4-dspark", ["model.path=inclusionAI/Ling-3.0-flash@v2",
                                                                 "stack.speculative.draft_model=inclusionAI/Ling-3.0-flash-dspark@" + COMMIT]))
    assert flag(plan.argv, "--model-path") == "inclusionAI/Ling-3.0-flash" and flag(plan.argv, "--revision") == "v2"
    assert flag(plan.argv, "--speculative-draft-model-path") == "inclusionAI/Ling-3.0-flash-dspark"
    assert flag(plan.argv, "--speculative-draft-model-revision") == COMMIT
    assert [(p["role"], p["ref"]) for p in plan.model_pulls] == [
        ("target", "inclusionAI/Ling-3.0-flash@v2"), ("draft", f"inclusionAI/Ling-3.0-flash-dspark@{COMMIT}")]
    fake = fake_download(cache, "inclusionAI/Ling-3.0-flash-dspark")  # its commit is the pinned one
    plan = compile_plan(load_recipe("ling-3.0-flash/tp4-dspark", [
        "stack.speculative.draft_model=inclusionAI/Ling-3.0-flash-dspark@" + COMMIT]))
    assert flag(plan.argv, "--speculative-draft-model-path") == str(fake)
    assert "--speculative-draft-model-revision" not in plan.argv
    model = check_model(plan, Host())
    assert model.status == Status.FAIL and "inclusionAI/Ling-3.0-flash (target) is not here" in model.detail
    assert "dspark" not in model.fix  # only what is missing


def test_the_embedded_engine_loads_a_pulled_hub_model_too(cache, tmp_path):
    snapshot = fake_download(cache, "someorg/tiny", shards=False)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("extends: tiny\nmodel:\n  path: someorg/tiny\n  served_name: null\n")
    plan = compile_plan(load_recipe(str(recipe)))
    assert flag(plan.argv, "--model-path") == str(snapshot) and flag(plan.argv, "--served-model-name") == "someorg/tiny"
    assert plan.env["HF_HUB_OFFLINE"] == "1"
