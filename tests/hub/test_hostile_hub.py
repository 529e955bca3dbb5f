"""Issue 40: a hub is untrusted input. Each attack is made for real by the local hub
(tests/hub_server.py's hostile scenarios) against `sparkit pull` and `sparkit plan` as processes:

- ids, hashes and commits that name paths (absolute, `..`, not hex) and sizes that are not sizes:
  refused from the listing, before a file is asked for, and nothing outside the Hugging Face cache
  and sparkit's state is read, written, linked or deleted (item 1);
- a body longer than the file's listed size is stopped at the first byte too many (item 7);
- config.json, an index or a safetensors header nested thousands deep, and absurd shapes, are one
  clear error (exit 8), not a RecursionError or an OverflowError (item 10);
- a HEAD that changes its story after the file was verified never gets an unverified blob linked
  into the snapshot, nor a link made outside the cache (item 12).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import pytest

from _hub import one_error, run_sparkit, served_files

TINY = "sparkit-test/tiny-ling"


def cache_repo(env: dict, repo: str) -> Path:
    return Path(env["HF_HUB_CACHE"]) / ("models--" + repo.replace("/", "--"))


def source(hub, repo: str, path: str) -> Path:
    spec = json.loads((hub.root / "repos.json").read_text())[repo]
    return hub.root / spec["commits"][spec["refs"]["main"]] / path


def tree(root: Path) -> dict[str, bytes | str]:
    """Every entry below `root`: a file's bytes, a link's target, a directory's name."""
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        out[rel] = os.readlink(path) if path.is_symlink() else (path.read_bytes() if path.is_file() else "dir")
    return out


@pytest.fixture
def victim(tmp_path) -> Path:
    """Files of the user's outside every cache, which a hostile hub names."""
    area = tmp_path / "victim"
    area.mkdir()
    (area / "notes.txt").write_text("the user's notes, which no pull may delete\n")
    (area / "weights.bin").write_bytes(os.urandom(1000))
    (area / "settings.json").write_text('{"the user\'s": "settings"}\n')
    (area / "planted").mkdir()
    return area


def file_requests(hub, repo: str = TINY) -> list[dict]:
    """The requests for a file of `repo` (resolve, and the CDN's): all but the listing."""
    return [r for r in hub.stats()["requests"] if r["cdn"] or f"/{repo}/resolve/" in r["path"]]


# ------------------------------------------------------------------------------ item 1: ids that name paths

LISTING_LIES = {
    # scenario: (where, the lie (a function of the victim area and the environment), the file, the field)
    "a git oid that is the absolute path of a file of the listed size": (
        "listing", lambda v, env: {"blobId": str(v / "notes.txt"), "size": (v / "notes.txt").stat().st_size},
        "generation_config.json", "blobId"),
    "an LFS sha256 that is the absolute path of a file of the listed size": (
        "listing", lambda v, env: {"lfs.sha256": str(v / "weights.bin"), "lfs.size": 1000},
        "model.safetensors", "lfs.sha256"),
    "a git oid of .. components up to a file of the listed size": (
        "listing", lambda v, env: {"blobId": os.path.relpath(v / "notes.txt", cache_repo(env, TINY) / "blobs"),
                                   "size": (v / "notes.txt").stat().st_size},
        "generation_config.json", "blobId"),
    "a git oid naming where nothing is (its .incomplete and .lock would land there)": (
        "listing+head", lambda v, env: {"blobId": str(v / "planted" / "x")},
        "generation_config.json", "blobId"),
    "a git oid that is not hex": ("listing", lambda v, env: {"blobId": "z" * 40}, "generation_config.json", "blobId"),
    "a commit that is the absolute path of a .json (without its suffix)": (
        "info", lambda v, env: {"sha": str(v / "settings")}, None, "sha"),
    "a commit that is not hex": ("info", lambda v, env: {"sha": "HEAD~1" + "0" * 34}, None, "sha"),
}


@pytest.mark.parametrize("scenario", list(LISTING_LIES))
def test_ids_that_name_paths_are_refused_before_any_file_is_asked_for(hub, hub_env, victim, scenario):
    where, lie, path, field = LISTING_LIES[scenario]
    values = lie(victim, hub_env)
    (cache_repo(hub_env, TINY) / "blobs").mkdir(parents=True)  # `..` from there resolves
    if where.startswith("listing"):
        hub.lie(TINY, "listing", values, path=path)
    if where.endswith("head"):  # the HEAD agrees with the listing: the client gets as far as the download
        hub.lie(TINY, "head", {"ETag": f'"{values["blobId"]}"'}, path=path)
    if where == "info":
        hub.lie(TINY, "info", values)
    before = tree(victim)
    done = run_sparkit(hub_env, "pull", TINY, "--json")
    text = one_error(done, 9)
    assert field in text and (path is None or path in text) and "not a" in text, text
    assert tree(victim) == before  # nothing deleted, overwritten, created or linked there
    assert file_requests(hub) == []  # refused from the listing: no file was asked for
    assert done.stdout == ""


SIZE_LIES = [
    ("model.safetensors", "lfs.size", -1),
    ("model.safetensors", "lfs.size", float("inf")),
    ("model.safetensors", "lfs.size", 10**30),
    ("generation_config.json", "size", "112"),
    ("generation_config.json", "size", True),
]


@pytest.mark.parametrize("path,field,value", SIZE_LIES, ids=[f"{f}={v!r}" for _, f, v in SIZE_LIES])
def test_sizes_that_are_not_sizes_are_refused_before_any_file_is_asked_for(hub, hub_env, path, field, value):
    hub.lie(TINY, "listing", {field: value}, path=path)
    text = one_error(run_sparkit(hub_env, "pull", TINY), 9)
    assert f"{path}: {field}" in text and "not a size" in text, text
    assert file_requests(hub) == []


@pytest.mark.parametrize("name", ["../../escape.json", "/tmp/escape.json", "a/../../escape.json"])
def test_file_names_that_leave_the_snapshot_are_refused(hub, hub_env, name):
    hub.lie(TINY, "listing", {"rfilename": name}, path="README.md")
    text = one_error(run_sparkit(hub_env, "pull", TINY), 9)
    assert "rfilename" in text and "not a file name" in text, text
    assert file_requests(hub) == []


@pytest.mark.slow
def test_plan_of_a_recipe_naming_a_hub_that_lies_about_its_commit_writes_nothing_outside(hub, hub_env, victim,
                                                                                           tmp_path):
    """`sparkit plan` reads the safetensors headers of a hub model through sparkit's header cache,
    `<commit>.json`: a commit that is an absolute path had it overwrite the user's .json (rc 0)."""
    hub.lie(TINY, "info", {"sha": str(victim / "settings")})
    recipe = tmp_path / "hub-tiny.yaml"
    recipe.write_text(f"extends: tiny\nmodel:\n  path: {TINY}\n")
    before = tree(victim)
    planned = run_sparkit(hub_env, "plan", str(recipe), "--json")
    assert planned.returncode == 0, planned.stderr
    assert tree(victim) == before
    fit = json.loads(planned.stdout)["memory_fit"]
    assert "sha" in fit["checkpoint_note"] and "not a commit" in fit["checkpoint_note"], fit
    assert file_requests(hub) == []


# ------------------------------------------------------------------------------ item 12: a HEAD that changes its story

def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def assert_only_verified_blobs_are_linked(env: dict, snapshot: Path) -> None:
    blobs = cache_repo(env, TINY) / "blobs"
    linked = set()
    for link in snapshot.iterdir():
        assert link.is_symlink() and link.resolve().parent == blobs.resolve(), link
        data = link.read_bytes()
        name = link.resolve().name
        assert name in (hashlib.sha256(data).hexdigest(), git_oid(data)), f"{link.name} -> unverified blob {name}"
        linked.add(name)
    assert {p.name for p in blobs.iterdir()} == linked  # no other blob was written either


@pytest.mark.parametrize("path,header", [
    ("model.safetensors", {"X-Linked-Etag": '"' + "f" * 64 + '"'}),
    ("generation_config.json", {"ETag": '"' + "e" * 40 + '"'}),
    ("generation_config.json", {"X-Repo-Commit": "VICTIM/snapshot"}),
], ids=["another sha256", "another git oid", "a commit that is a path"])
def test_a_head_that_changes_its_answer_after_the_file_was_verified_links_nothing_unverified(
        hub, hub_env, victim, path, header):
    """The second HEAD of the file (huggingface_hub's, when it linked the snapshot) said another
    etag: it downloaded that blob unverified and linked it (rc 1, left linked), or, for a commit
    that is a path, made the snapshot's link there. Now the snapshot is linked from what was
    verified, with no second question."""
    header = {k: v.replace("VICTIM", str(victim)) for k, v in header.items()}
    hub.lie(TINY, "head", header, path=path, first=2)
    before = tree(victim)
    done = run_sparkit(hub_env, "pull", TINY, "--json")
    assert done.returncode == 0, done.stderr
    assert tree(victim) == before
    snapshot = Path(json.loads(done.stdout)["repos"][0]["snapshot"])
    assert_only_verified_blobs_are_linked(hub_env, snapshot)
    heads = [r for r in file_requests(hub) if r["method"] == "HEAD" and r["path"].endswith("/" + path)]
    assert len(heads) == 1


def test_a_head_whose_etag_differs_from_the_listing_is_refused_and_nothing_of_it_is_linked(hub, hub_env):
    hub.lie(TINY, "head", {"X-Linked-Etag": '"' + "f" * 64 + '"'}, path="model.safetensors")
    text = one_error(run_sparkit(hub_env, "pull", TINY), 9)
    assert "model.safetensors" in text and "disagrees with its listing" in text
    assert not (cache_repo(hub_env, TINY) / "snapshots").exists() or \
        not any(p.name == "model.safetensors" for p in (cache_repo(hub_env, TINY) / "snapshots").rglob("*"))
    assert not (cache_repo(hub_env, TINY) / "blobs" / ("f" * 64)).exists()


# ------------------------------------------------------------------------------ item 7: more bytes than listed

@pytest.mark.parametrize("length", ["sent", "none"], ids=["a Content-Length that counts them", "no Content-Length"])
def test_bytes_past_the_listed_size_abort_the_file_at_once(hub, hub_env, length):
    size = source(hub, TINY, "generation_config.json").stat().st_size
    extra = 64 * 1024 * 1024
    hub.control(op="extra", path="generation_config.json", bytes=extra, length=length)
    done = run_sparkit(hub_env, "pull", TINY, "--workers", "1")
    text = one_error(done, 8)
    assert f"generation_config.json: the hub sent more than the {size} bytes it listed" in text, text
    assert "nothing of it was kept" in text
    assert not list((cache_repo(hub_env, TINY) / "blobs").glob("*.incomplete"))
    assert served_files(hub, TINY)["generation_config.json"] < extra  # the client hung up: it read no 64 MiB
    percents = [int(w[1:-2]) for line in done.stderr.splitlines() for w in line.split() if w.startswith("(")
                and w.endswith("%),")]
    assert all(p <= 100 for p in percents), done.stderr


# ------------------------------------------------------------------------------ item 10: deep JSON, absurd shapes

DEEP = "[" * 100_000 + "]" * 100_000
CONFIG = json.dumps({"architectures": ["BailingMoeV2ForCausalLM"], "model_type": "bailing_moe_v2"})


def safetensors(header: str | dict) -> bytes:
    raw = (header if isinstance(header, str) else json.dumps(header)).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"\0" * 8


TINY_WEIGHTS = safetensors({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}})


@pytest.mark.parametrize("files,named", [
    ({"config.json": DEEP, "model.safetensors": TINY_WEIGHTS}, "config.json"),
    ({"config.json": CONFIG, "model.safetensors.index.json": '{"weight_map": ' + DEEP + "}",
      "model-00001-of-00001.safetensors": TINY_WEIGHTS}, "model.safetensors.index.json"),
], ids=["config.json", "the index"])
def test_pull_of_json_nested_thousands_deep_is_one_clear_error(hub, hub_env, files, named):
    hub.add_repo("hostile/deep", files)
    text = one_error(run_sparkit(hub_env, "pull", "hostile/deep"), 8)
    assert "hostile/deep@" in text and named in text and "nested more than" in text, text


HEADERS = {
    "a header nested thousands deep": DEEP,
    "a shape of 10**400": json.dumps({"w": {"dtype": "BF16", "shape": [10**400], "data_offsets": [0, 8]}}),
    "a shape of 200000 dims of 10**9": json.dumps({"w": {"dtype": "BF16", "shape": [10**9] * 200_000,
                                                         "data_offsets": [0, 8]}}),
    "a number of 5000 digits": '{"w": {"dtype": "BF16", "shape": [' + "9" * 5000 + '], "data_offsets": [0, 8]}}',
}


@pytest.mark.slow
@pytest.mark.parametrize("header", list(HEADERS))
def test_plan_of_a_hub_checkpoint_with_an_absurd_header_is_a_clear_error(hub, hub_env, tmp_path, header):
    hub.add_repo("hostile/header", {"config.json": CONFIG, "model.safetensors": safetensors(HEADERS[header])})
    recipe = tmp_path / "hostile.yaml"
    recipe.write_text("extends: tiny\nmodel:\n  path: hostile/header\n")
    planned = run_sparkit(hub_env, "plan", str(recipe), "--json")
    assert "Traceback" not in planned.stderr and "internal error" not in planned.stderr, planned.stderr
    assert planned.returncode in (0, 8), planned.stderr
    said = planned.stderr if planned.returncode else json.loads(planned.stdout)["memory_fit"]["summary"]
    assert "hostile/header@" in said and "model.safetensors" in said, said
