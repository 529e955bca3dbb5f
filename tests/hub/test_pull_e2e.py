"""`sparkit pull` against a local hub (tests/hub_server.py) with huggingface_hub's unmodified
client: exactly the engine's files per layout and variant, the cache laid out as huggingface_hub
lays it (transformers and huggingface_hub find the model offline), every file verified, nothing
fetched twice, the page cache dropped, progress as plain lines without a terminal."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _hub import ENGINE_FILES, commit, run_sparkit, served_files


def files_in(snapshot: Path) -> set[str]:
    return {p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_symlink() or p.is_file()}


def source_dir(hub, repo: str, rev: str = "main") -> Path:
    spec = json.loads((hub.root / "repos.json").read_text())[repo]
    return hub.root / spec["commits"][spec["refs"][rev]]


LAYOUTS = {
    "sparkit-test/tiny-ling": ENGINE_FILES | {"model.safetensors"},
    "sparkit-test/tiny-ling@v0": ENGINE_FILES | {"model.safetensors"},
    "sparkit-test/tiny-ling-sharded": ENGINE_FILES | {"model.safetensors.index.json",
                                                       *(f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3))},
    "sparkit-test/tiny-ling-fp32": ENGINE_FILES | {"model.safetensors.index.json",
                                                    *(f"model-0000{i}-of-00002.safetensors" for i in (1, 2))},
}


@pytest.mark.parametrize("ref", list(LAYOUTS))
def test_each_layout_pulls_exactly_the_files_the_engine_reads_each_once(hub, hub_env, ref):
    repo, _, rev = ref.partition("@")
    done = run_sparkit(hub_env, "pull", ref, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    (pulled,) = doc["repos"]
    assert pulled["commit"] == commit(f"{repo}@{rev or 'main'}") and doc["complete"]
    snapshot = Path(pulled["snapshot"])
    assert files_in(snapshot) == LAYOUTS[ref]
    source = source_dir(hub, repo, rev or "main")
    # What left the server: each of those files' bytes once, nothing of the files the engine never reads.
    assert served_files(hub, repo) == {p: (source / p).stat().st_size for p in LAYOUTS[ref]}
    assert doc["fetched_bytes"] == doc["total_bytes"] == sum((source / p).stat().st_size for p in LAYOUTS[ref])
    blobs = Path(hub_env["HF_HUB_CACHE"]) / ("models--" + repo.replace("/", "--")) / "blobs"
    for path in LAYOUTS[ref]:
        link = snapshot / path
        # huggingface_hub's layout: a relative symlink to the blob named by the file's etag
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        assert link.resolve().parent == blobs.resolve()
        data = link.read_bytes()
        assert data == (source / path).read_bytes()
        entry = next(f for f in pulled["files"] if f["path"] == path)
        assert entry["state"] == "done"
        if path.endswith(".safetensors"):
            assert link.resolve().name == hashlib.sha256(data).hexdigest() == entry["sha256"]
    assert not list(blobs.glob("*.incomplete"))
    ref_file = Path(hub_env["HF_HUB_CACHE"]) / ("models--" + repo.replace("/", "--")) / "refs" / (rev or "main")
    assert ref_file.read_text() == pulled["commit"]
    skipped = {s["path"] for s in pulled["skipped"]}
    if repo == "sparkit-test/tiny-ling" and not rev:
        assert skipped == {"README.md", ".gitattributes", "pytorch_model.bin", "consolidated.safetensors",
                           "original/model.safetensors", "images/diagram.png"}
    if repo == "sparkit-test/tiny-ling-sharded":
        assert "model-00001-of-00002.safetensors" in skipped  # the stale layout beside the index


@pytest.mark.slow
def test_transformers_and_huggingface_hub_find_the_pulled_model_offline(hub, hub_env):
    assert run_sparkit(hub_env, "pull", "sparkit-test/tiny-ling-sharded").returncode == 0
    code = ("import json, transformers, huggingface_hub\n"
            "path = huggingface_hub.snapshot_download('sparkit-test/tiny-ling-sharded')\n"
            "config = transformers.AutoConfig.from_pretrained('sparkit-test/tiny-ling-sharded', trust_remote_code=True)\n"
            "tok = transformers.AutoTokenizer.from_pretrained('sparkit-test/tiny-ling-sharded', trust_remote_code=True)\n"
            "print(json.dumps({'path': path, 'type': type(config).__name__, 'ids': tok('count: one two')['input_ids']}))\n")
    env = {**hub_env, "HF_HUB_OFFLINE": "1"}
    found = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert found.returncode == 0, found.stderr[-3000:]
    out = json.loads(found.stdout.strip().splitlines()[-1])
    assert out["path"].endswith(commit("sparkit-test/tiny-ling-sharded@main"))
    assert out["type"] == "BailingMoeV2Config" and out["ids"]


@pytest.mark.slow
def test_a_second_pull_fetches_nothing_and_plain_progress_has_a_line_per_file_and_totals(hub, hub_env):
    first = run_sparkit(hub_env, "pull", "sparkit-test/tiny-ling")
    assert first.returncode == 0, first.stderr
    lines = first.stderr.splitlines()
    # No terminal: plain lines, no carriage returns or escape sequences; one "ok" line per file.
    assert "\r" not in first.stderr and "\x1b[" not in first.stderr
    oks = [line for line in lines if line.startswith("ok ")]
    assert len(oks) == 7 and any("model.safetensors" in line and "sha256 matches the hub's" in line for line in oks)
    assert any(line.startswith("total ") and "(100%)" in line and "/s" in line for line in lines)
    assert sum(1 for line in lines if line.startswith("fetch ")) == 7
    served = served_files(hub, "sparkit-test/tiny-ling")
    again = run_sparkit(hub_env, "pull", "sparkit-test/tiny-ling", "--json")
    assert again.returncode == 0 and "nothing to fetch" in again.stderr
    assert served_files(hub, "sparkit-test/tiny-ling") == served
    assert json.loads(again.stdout)["fetched_bytes"] == 0
    assert all(f["state"] == "present" for f in json.loads(again.stdout)["repos"][0]["files"])


@pytest.mark.slow
def test_the_page_cache_holds_none_of_the_pulled_files(hub, hub_env, tmp_path):
    from sparkit.memory.pagecache import evict, resident_bytes

    probe = tmp_path / "probe"  # a file system where fadvise drops pages (not tmpfs)
    probe.write_bytes(os.urandom(1 << 20))
    os.sync()
    evict(probe)
    if resident_bytes(probe) > 0:
        pytest.skip("this file system keeps pages posix_fadvise(DONTNEED) asks to drop (tmpfs)")
    done = run_sparkit(hub_env, "pull", "sparkit-test/tiny-ling-fp32", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    snapshot = Path(doc["repos"][0]["snapshot"])
    weights = [p.resolve() for p in snapshot.glob("*.safetensors")]
    assert weights and sum(p.stat().st_size for p in weights) > 10 << 20
    assert sum(resident_bytes(p) for p in weights) == 0 == doc["page_cache_bytes"]
    assert "page cache: 0 B of the" in done.stderr
    # The listing of pulled models says so too, and the memory picture counts the model's cache.
    listed = run_sparkit(hub_env, "pull", "--list", "--json")
    (row,) = json.loads(listed.stdout)["models"]
    assert row["repo"] == "sparkit-test/tiny-ling-fp32" and row["complete"] and row["page_cache_bytes"] == 0
    for p in weights:
        p.read_bytes()  # an engine loading it: now it is in the page cache
    # On a shared machine the kernel may reclaim a few of those pages at any moment, so the doctor's
    # figure is held between what mincore says just before and just after it ran (pages only leave).
    before = sum(resident_bytes(p) for p in weights)
    doctor = run_sparkit(hub_env, "doctor", "--json")
    after = sum(resident_bytes(p) for p in weights)
    assert before > sum(p.stat().st_size for p in weights) // 2
    caches = {c["directory"]: c for c in json.loads(doctor.stdout)["memory"]["checkpoints"]}
    assert after <= caches[str(snapshot.resolve())]["cached_bytes"] <= before


@pytest.mark.slow
def test_dry_run_lists_the_files_and_downloads_no_weights(hub, hub_env):
    done = run_sparkit(hub_env, "pull", "--dry-run", "sparkit-test/tiny-ling-sharded")
    assert done.returncode == 0, done.stderr
    assert "skip" in done.stdout and "model-00001-of-00002.safetensors: not one of the weights" in done.stdout
    assert sum(1 for line in done.stdout.splitlines() if line.strip().startswith("queued")) == 10
    assert set(served_files(hub, "sparkit-test/tiny-ling-sharded")) <= {"config.json", "model.safetensors.index.json"}
    assert not (Path(hub_env["HF_HUB_CACHE"]) / "models--sparkit-test--tiny-ling-sharded" / "blobs").exists()


@pytest.mark.slow
def test_check_verifies_the_local_copy_without_downloading(hub, hub_env):
    assert run_sparkit(hub_env, "pull", "sparkit-test/tiny-ling").returncode == 0
    served = served_files(hub, "sparkit-test/tiny-ling")
    checked = run_sparkit(hub_env, "pull", "--check", "sparkit-test/tiny-ling", "--json")
    assert checked.returncode == 0, checked.stderr
    assert all(f["state"] == "present" for f in json.loads(checked.stdout)["repos"][0]["files"])
    assert served_files(hub, "sparkit-test/tiny-ling") == served
    assert sum(1 for line in checked.stderr.splitlines() if line.startswith("verify ")) == 7


@pytest.mark.slow
def test_a_recipe_pulls_its_model_and_its_separate_draft_model_and_one_without_hub_models_nothing(hub, hub_env, tmp_path):
    recipe = tmp_path / "draft.yaml"
    recipe.write_text("extends: tiny\nmodel:\n  path: sparkit-test/tiny-ling\nstack:\n  speculative:\n"
                      "    draft_model: sparkit-test/tiny-ling-sharded\n")
    done = run_sparkit(hub_env, "pull", str(recipe), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [(r["ref"], r["role"]) for r in doc["repos"]] == [("sparkit-test/tiny-ling", "target"),
                                                             ("sparkit-test/tiny-ling-sharded", "draft")]
    assert doc["complete"] and doc["recipes"][0]["verdict"] == "fits"
    assert "draft: memory fit: fits" in done.stderr  # the recipe's fit, before anything moved
    plan = json.loads(run_sparkit(hub_env, "plan", str(recipe), "--json").stdout)
    assert [p["state"] for p in plan["model_pulls"]] == ["verified", "verified"]
    nothing = run_sparkit(hub_env, "pull", "tiny", "--json")
    assert nothing.returncode == 0 and "nothing to pull: tiny serves sparkit:tiny-ling" in nothing.stderr
    assert json.loads(nothing.stdout)["repos"] == []


@pytest.mark.slow
def test_a_recipe_that_cannot_fit_is_refused_before_a_byte_of_weights_moves(hub, hub_env):
    sets = ["--set", "server.max_running_requests=64"]  # 64 requests at 256K tokens: no Spark holds that KV cache
    done = run_sparkit(hub_env, "pull", "ling-3.0-flash/spark-optimized", *sets, timeout=900)
    assert done.returncode == 4, done.stderr
    text = " ".join(done.stderr.split())
    assert "error: ling-3.0-flash/spark-optimized: the memory fit says it does not fit (does not fit: needs" in text
    assert "nothing was downloaded" in text and "--ignore-fit downloads it anyway" in text
    assert "`sparkit plan ling-3.0-flash/spark-optimized --set server.max_running_requests=64` shows every term" in text
    assert not [r for r in hub.stats()["requests"] if r["cdn"] and not r["range"]]  # headers only
    assert not (Path(hub_env["HF_HUB_CACHE"]) / "models--inclusionAI--Ling-3.0-flash-fp4" / "blobs").exists()
