"""The memory fit of a hub-id recipe with no local copy: read from the checkpoint's safetensors
headers on the local hub by range requests, it equals the fit of the same files on disk (tiny-ling's
layouts, and Ling-3.0-flash-fp4's real header layout at full size); nothing is downloaded or
written into the Hugging Face cache; a commit's headers are kept, so a later plan offline still
has them; offline without them, the declared profile, said so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _hub import run_sparkit


def terms(plan_json: str) -> list[tuple[str, str, int]]:
    fit = json.loads(plan_json)["memory_fit"]
    return [(t["group"], t["name"], t["bytes"]) for t in fit["terms"]]


def source_dir(hub, repo: str) -> Path:
    spec = json.loads((hub.root / "repos.json").read_text())[repo]
    return Path(hub.root / spec["commits"][spec["refs"]["main"]])


@pytest.mark.slow
def test_plan_of_the_shipped_spark_recipe_reads_ling_s_headers_from_the_hub_and_fits_as_the_local_copy(hub, hub_env):
    remote = run_sparkit(hub_env, "plan", "ling-3.0-flash/spark-optimized", "--json", timeout=900)
    assert remote.returncode == 0, remote.stderr
    local = run_sparkit(hub_env, "plan", "ling-3.0-flash/spark-optimized", "--json", "--set",
                        f"model.path={hub.ling_dir}", timeout=900)
    assert local.returncode == 0, local.stderr
    assert terms(remote.stdout) == terms(local.stdout)
    fit = json.loads(remote.stdout)["memory_fit"]
    assert fit["verdict"] == json.loads(local.stdout)["memory_fit"]["verdict"] == "fits"
    # The target's weights as the checkpoint stores them (not sparkit's FP8 head copy, nor the NextN
    # draft's layer and the embedding and lm_head it holds until shared): the -fp4 target's
    # published ~64-65 GB (SGLang's load log on a DGX Spark: "mem usage=64.88 GB").
    target = sum(t[2] for t in terms(remote.stdout) if t[0] == "weights"
                 and not t[1].startswith(("NextN", "FP8 lm_head copy")))
    assert 63 * 1024**3 < target < 66 * 1024**3
    assert f"read from {hub.url} by range requests" in fit["checkpoint_note"]
    assert fit["checkpoint"].startswith("inclusionAI/Ling-3.0-flash-fp4@")
    # the roofline read the same headers (not the declared profile)
    layout = json.loads(remote.stdout)["roofline"]["layout"]
    assert layout["source"] == "checkpoint" and "range requests" in layout["detail"]
    # Headers only: every file request was a range request (the model info is the one plain GET),
    # and nothing landed in the Hugging Face cache.
    requests = [r for r in hub.stats()["requests"] if "Ling-3.0-flash-fp4" in r["path"] or r["cdn"]]
    assert [r for r in requests if r["method"] == "GET" and not r["range"]] == \
        [r for r in requests if r["path"].startswith("/api/models/")]
    assert not (Path(hub_env["HF_HUB_CACHE"]) / "models--inclusionAI--Ling-3.0-flash-fp4").exists()
    # A commit's headers are kept: the next plan, offline, has the same fit, and says where it came from.
    offline = run_sparkit({**hub_env, "HF_HUB_OFFLINE": "1"}, "plan", "ling-3.0-flash/spark-optimized", "--json",
                          timeout=900)
    assert offline.returncode == 0, offline.stderr
    assert terms(offline.stdout) == terms(remote.stdout)
    assert "kept by sparkit" in json.loads(offline.stdout)["memory_fit"]["checkpoint_note"]


@pytest.mark.slow
@pytest.mark.parametrize("repo", ["sparkit-test/tiny-ling", "sparkit-test/tiny-ling-sharded", "sparkit-test/tiny-ling-fp32"])
def test_tiny_ling_layouts_fit_from_the_hub_as_from_disk(hub, hub_env, repo, tmp_path):
    recipe = tmp_path / "hub-tiny.yaml"
    recipe.write_text(f"extends: tiny\nmodel:\n  path: {repo}\n")
    remote = run_sparkit(hub_env, "plan", str(recipe), "--json")
    assert remote.returncode == 0, remote.stderr
    local = run_sparkit(hub_env, "plan", str(recipe), "--json", "--set", f"model.path={source_dir(hub, repo)}")
    assert local.returncode == 0, local.stderr
    assert terms(remote.stdout) == terms(local.stdout) and terms(remote.stdout)
    assert json.loads(remote.stdout)["memory_fit"]["verdict"] == json.loads(local.stdout)["memory_fit"]["verdict"]
    doc = json.loads(remote.stdout)
    (pull,) = doc["model_pulls"]
    assert pull["ref"] == repo and pull["local"] is None and pull["state"] == "absent"
    assert any(p["provider"] == "sparkit-pull" and f"`sparkit pull {repo}`" in p["detail"] for p in doc["provisions"])


@pytest.mark.slow
def test_offline_with_nothing_kept_the_fit_is_the_declared_profile_said_so_and_a_draft_without_one_is_unknown(hub_env):
    env = {**hub_env, "HF_HUB_OFFLINE": "1"}
    spark = run_sparkit(env, "plan", "ling-3.0-flash/spark-optimized", "--json", timeout=900)
    assert spark.returncode == 0, spark.stderr
    fit = json.loads(spark.stdout)["memory_fit"]
    assert fit["verdict"] == "fits" and "sparkit's declared profile of Ling-3.0-flash-fp4" in fit["checkpoint_note"]
    assert "offline (HF_HUB_OFFLINE=1)" in fit["checkpoint_note"]
    assert any("from sparkit's declared profile" in t["detail"] for t in fit["terms"])
    dspark = run_sparkit(env, "plan", "ling-3.0-flash/tp4-dspark", "--json", timeout=900)
    fit = json.loads(dspark.stdout)["memory_fit"]
    assert fit["verdict"] == "unknown" and "cannot read the draft checkpoint inclusionAI/Ling-3.0-flash-dspark" in fit["summary"]
    assert "`sparkit pull inclusionAI/Ling-3.0-flash-dspark`" in fit["need"]
