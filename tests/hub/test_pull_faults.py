"""Every fault of a pull, for real, against the local hub: kill -9 and Ctrl-C mid-file, a connection
that drops once or for good, a byte flipped in transit (once, and for ever), a blob damaged or
truncated on disk, a disk too small before the pull and one that fills mid-file (tmpfs; root),
404 / 401 / 403, a revision that does not exist, offline and no network. Each ends in one clear
error with its documented exit code (or a pull that recovers), and keeps what was verified and
every byte of a file that reached the machine; the bytes fetched twice are counted by the server
and bounded."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from _hub import NOT_GRANTED, TOKEN, Pulling, one_error, run_sparkit, served_files
from _shared import fill_disk

MiB = 1024 * 1024
V0 = "sparkit-test/tiny-ling@v0"  # its model.safetensors: float32, ~10.1 MiB
IN_FLIGHT = 64 * 1024  # bytes a pull may receive twice: what the kernel held when it stopped


def v0_weights(hub) -> tuple[int, int]:
    """(size of v0's model.safetensors, a byte past its middle, inside the test hub's 64 KiB write):
    where a fault cuts it. From the file, not a figure: tiny-ling's size follows its declaration
    (experts of width 128: 10.1 MiB)."""
    size = source(hub, "sparkit-test/tiny-ling", "v0", "model.safetensors").stat().st_size
    return size, size // 2 + 12_345


def source(hub, repo: str, rev: str, path: str) -> Path:
    spec = json.loads((hub.root / "repos.json").read_text())[repo]
    return hub.root / spec["commits"][spec["refs"][rev]] / path


def blobs(env: dict, repo: str) -> Path:
    return Path(env["HF_HUB_CACHE"]) / ("models--" + repo.replace("/", "--")) / "blobs"


def wait_for_partial(env: dict, repo: str, at_least: int, proc: subprocess.Popen) -> Path:
    """The partial download once it holds `at_least` bytes (polled: it grows a chunk at a time)."""
    import time

    for _ in range(6000):
        found = [p for p in blobs(env, repo).glob("*.incomplete") if p.stat().st_size >= at_least] \
            if blobs(env, repo).is_dir() else []
        if found:
            return found[0]
        assert proc.poll() is None, "the pull ended before its partial download grew"
        time.sleep(0.05)
    raise AssertionError("no partial download appeared")


# ------------------------------------------------------------------------------ interrupted

@pytest.mark.slow
def test_kill_9_mid_file_keeps_every_byte_that_arrived_and_the_next_pull_fetches_none_twice(hub, hub_env):
    weights = source(hub, "sparkit-test/tiny-ling", "v0", "model.safetensors")
    size, block_at = v0_weights(hub)
    hub.control(op="block", path="model.safetensors", after=block_at)
    pulling = Pulling(hub_env, V0, "--workers", "1")
    partial = wait_for_partial(hub_env, "sparkit-test/tiny-ling", block_at, pulling.proc)
    pulling.proc.send_signal(signal.SIGKILL)
    pulling.proc.wait(timeout=60)
    hub.control(op="release")
    kept = partial.stat().st_size
    assert kept == block_at  # each byte went to disk as it arrived: the kill lost none of them
    before = served_files(hub, "sparkit-test/tiny-ling")
    assert before["model.safetensors"] == block_at

    resumed = run_sparkit(hub_env, "pull", V0, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert f"fetch   {V0}: model.safetensors" in resumed.stderr
    assert f"(resuming at {block_at / MiB:.1f} MiB)" in resumed.stderr
    served = served_files(hub, "sparkit-test/tiny-ling")
    assert served["model.safetensors"] == size  # nothing came twice
    assert all(served[p] == before[p] for p in before if p != "model.safetensors")  # the small files: once
    doc = json.loads(resumed.stdout)
    entry = next(f for f in doc["repos"][0]["files"] if f["path"] == "model.safetensors")
    assert entry["resumed_from"] == kept and entry["fetched"] == size - kept and entry["state"] == "done"
    snapshot = Path(doc["repos"][0]["snapshot"])
    assert (snapshot / "model.safetensors").read_bytes() == weights.read_bytes()
    assert not list(blobs(hub_env, "sparkit-test/tiny-ling").glob("*.incomplete"))


@pytest.mark.slow
def test_a_resume_the_server_answers_with_the_whole_file_starts_the_file_over_and_verifies(hub, hub_env):
    size, block_at = v0_weights(hub)
    hub.control(op="block", path="model.safetensors", after=block_at)
    pulling = Pulling(hub_env, V0, "--workers", "1")
    wait_for_partial(hub_env, "sparkit-test/tiny-ling", block_at, pulling.proc)
    pulling.proc.send_signal(signal.SIGKILL)
    pulling.proc.wait(timeout=60)
    hub.control(op="reset")
    hub.control(op="norange", path="model.safetensors")  # a CDN that ignores Range: 200 and every byte
    resumed = run_sparkit(hub_env, "pull", V0, "--json")
    assert resumed.returncode == 0, resumed.stderr
    entry = next(f for f in json.loads(resumed.stdout)["repos"][0]["files"] if f["path"] == "model.safetensors")
    assert entry["state"] == "done" and entry["resumed_from"] == block_at and entry["fetched"] == size
    assert served_files(hub, "sparkit-test/tiny-ling")["model.safetensors"] == size
    snapshot = Path(json.loads(resumed.stdout)["repos"][0]["snapshot"])
    assert (snapshot / "model.safetensors").read_bytes() == source(hub, "sparkit-test/tiny-ling", "v0",
                                                                   "model.safetensors").read_bytes()


@pytest.mark.slow
def test_ctrl_c_mid_file_exits_130_at_once_says_what_is_kept_and_resumes(hub, hub_env):
    size, block_at = v0_weights(hub)
    hub.control(op="block", path="model.safetensors", after=block_at)
    pulling = Pulling(hub_env, V0, "--workers", "1")
    wait_for_partial(hub_env, "sparkit-test/tiny-ling", block_at, pulling.proc)
    pulling.proc.send_signal(signal.SIGINT)
    pulling.until(lambda line: line.startswith("stopping:"), "it said it was stopping")
    text = pulling.wait()  # the hub still holds the connection: the pull hung up on it
    hub.control(op="release")
    assert pulling.proc.returncode == 130, text
    assert (f"6 of 7 files verified and kept; model.safetensors kept at {block_at / MiB:.1f} MiB of "
            f"{size / MiB:.1f} MiB") in text
    assert f"`sparkit pull {V0}` resumes" in text and "Traceback" not in text
    resumed = run_sparkit(hub_env, "pull", V0)
    assert resumed.returncode == 0, resumed.stderr
    assert served_files(hub, "sparkit-test/tiny-ling")["model.safetensors"] - size < IN_FLIGHT


@pytest.mark.slow
def test_a_connection_dropped_mid_body_is_resumed_within_the_same_pull_from_the_byte_it_dropped_at(hub, hub_env):
    size, cut_at = v0_weights(hub)
    hub.control(op="cut", path="model.safetensors", after=cut_at, times=1)
    done = run_sparkit(hub_env, "pull", V0, "--workers", "1")
    assert done.returncode == 0, done.stderr
    assert f"model.safetensors: the connection dropped at {cut_at / MiB:.1f} MiB; continuing from there" in done.stderr
    assert served_files(hub, "sparkit-test/tiny-ling")["model.safetensors"] == size  # nothing came twice
    ranges = [r["range"] for r in hub.stats()["requests"] if r["cdn"] and r["method"] == "GET"]
    assert f"bytes={cut_at}-" in ranges


@pytest.mark.slow
def test_a_network_that_stays_down_is_one_error_keeping_the_partial_file_for_the_next_pull(hub, hub_env):
    cut_at = v0_weights(hub)[1]
    hub.control(op="cut", path="model.safetensors", after=cut_at, times=-1)  # and every request past it
    done = run_sparkit(hub_env, "pull", V0, "--workers", "1")
    text = one_error(done, 9)
    assert f"the connection to {hub.url} dropped while downloading sparkit-test/tiny-ling@v0: model.safetensors" in text
    assert f"{cut_at} of its" in text
    assert f"it resumes model.safetensors at byte {cut_at}" in text
    hub.control(op="reset")
    assert run_sparkit(hub_env, "pull", V0).returncode == 0


# ------------------------------------------------------------------------------ verified

@pytest.mark.slow
def test_a_byte_flipped_in_transit_is_detected_and_the_file_fetched_again_once(hub, hub_env):
    size = source(hub, "sparkit-test/tiny-ling", "main", "model.safetensors").stat().st_size
    hub.control(op="flip", path="model.safetensors", offset=5_000_000, times=1)
    done = run_sparkit(hub_env, "pull", "sparkit-test/tiny-ling", "--json")
    assert done.returncode == 0, done.stderr
    assert "model.safetensors: sha256" in done.stderr and "fetching it again from its first byte" in done.stderr
    doc = json.loads(done.stdout)
    assert doc["refetched_bytes"] == size and doc["fetched_bytes"] == doc["total_bytes"] + size
    assert served_files(hub, "sparkit-test/tiny-ling")["model.safetensors"] == 2 * size
    snapshot = Path(doc["repos"][0]["snapshot"])
    assert (snapshot / "model.safetensors").read_bytes() == source(hub, "sparkit-test/tiny-ling", "main",
                                                                   "model.safetensors").read_bytes()


@pytest.mark.slow
def test_a_file_the_hub_serves_damaged_every_time_is_an_error_naming_it_and_the_rest_is_kept(hub, hub_env):
    hub.control(op="flip", path="model.safetensors", offset=123, times=-1)
    done = run_sparkit(hub_env, "pull", "sparkit-test/tiny-ling")
    text = one_error(done, 8)
    assert "sparkit-test/tiny-ling: model.safetensors does not match the hub's sha256 after 2 downloads" in text
    assert not list(blobs(hub_env, "sparkit-test/tiny-ling").glob("*.incomplete"))
    hub.control(op="reset")
    again = run_sparkit(hub_env, "pull", "sparkit-test/tiny-ling", "--json")
    assert again.returncode == 0, again.stderr
    assert set(served_files(hub, "sparkit-test/tiny-ling")) == {"model.safetensors"}  # the 6 others were kept
    assert sum(f["state"] == "present" for f in json.loads(again.stdout)["repos"][0]["files"]) == 6


@pytest.mark.slow
def test_a_blob_damaged_or_truncated_on_disk_is_found_by_check_and_refetched_by_pull(hub, hub_env):
    first = run_sparkit(hub_env, "pull", "sparkit-test/tiny-ling-sharded", "--json")
    assert first.returncode == 0, first.stderr
    snapshot = Path(json.loads(first.stdout)["repos"][0]["snapshot"])
    flipped = (snapshot / "model-00002-of-00003.safetensors").resolve()
    with open(flipped, "r+b") as handle:
        handle.seek(1000)
        byte = handle.read(1)
        handle.seek(1000)
        handle.write(bytes([byte[0] ^ 1]))
    truncated = (snapshot / "tokenizer.json").resolve()
    os.truncate(truncated, truncated.stat().st_size - 10)
    hub.control(op="reset")

    checked = run_sparkit(hub_env, "pull", "--check", "sparkit-test/tiny-ling-sharded")
    text = one_error(checked, 8)
    assert "2 file(s) of the local copy are not the hub's" in text
    assert "model-00002-of-00003.safetensors (damaged)" in text and "tokenizer.json (damaged)" in text
    assert "`sparkit pull sparkit-test/tiny-ling-sharded` fetches them again" in text
    assert served_files(hub, "sparkit-test/tiny-ling-sharded") == {}  # --check downloads nothing

    repaired = run_sparkit(hub_env, "pull", "sparkit-test/tiny-ling-sharded")
    assert repaired.returncode == 0, repaired.stderr
    assert set(served_files(hub, "sparkit-test/tiny-ling-sharded")) == {"model-00002-of-00003.safetensors", "tokenizer.json"}
    assert run_sparkit(hub_env, "pull", "--check", "sparkit-test/tiny-ling-sharded").returncode == 0


# ------------------------------------------------------------------------------ disk

@pytest.fixture
def small_disk(tmp_path):
    """A real file system of 16 MiB (tmpfs; needs root), to fill up."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def fill(disk: Path, leave: int) -> Path:
    return fill_disk(disk, leave, chunk=65536)


@pytest.mark.slow
def test_a_disk_that_cannot_hold_the_model_is_refused_before_anything_moves(hub, hub_env, small_disk):
    env = {**hub_env, "HF_HUB_CACHE": str(small_disk / "hub")}
    fill(small_disk, leave=4 * MiB)
    done = run_sparkit(env, "pull", "sparkit-test/tiny-ling")
    text = one_error(done, 4)
    assert "not enough disk for sparkit-test/tiny-ling: 5.1 MiB left to fetch (7 files)" in text
    assert f"free on {small_disk}" in text and "short by" in text and "HF_HUB_CACHE=" in text
    assert set(served_files(hub, "sparkit-test/tiny-ling")) <= {"config.json"}  # only what sizing the pull reads
    assert not (small_disk / "hub" / "models--sparkit-test--tiny-ling" / "blobs").exists()


@pytest.mark.slow
def test_a_disk_that_fills_mid_file_names_the_file_keeps_the_rest_and_resumes(hub, hub_env, small_disk):
    env = {**hub_env, "HF_HUB_CACHE": str(small_disk / "hub")}
    hub.control(op="block", path="model.safetensors", after=4_000_000)
    pulling = Pulling(env, "sparkit-test/tiny-ling", "--workers", "1")
    pulling.until(lambda line: "fetch   sparkit-test/tiny-ling: model.safetensors" in line, "the weights started")
    while not hub.stats()["blocked"]:
        threading.Event().wait(0.05)
    filler = fill(small_disk, leave=256 * 1024)  # the room check has passed: now the disk fills
    hub.control(op="release")
    text = " ".join(pulling.wait().split())
    assert pulling.proc.returncode == 4, text
    assert "error: the disk filled while writing sparkit-test/tiny-ling: model.safetensors" in text
    assert "it resumes this file at byte" in text and "keeps the 6 file(s) already verified" in text
    filler.unlink()
    hub.control(op="reset")
    resumed = run_sparkit(env, "pull", "sparkit-test/tiny-ling", "--json")
    assert resumed.returncode == 0, resumed.stderr
    files = json.loads(resumed.stdout)["repos"][0]["files"]
    assert [f["path"] for f in files if f["state"] == "done"] == ["model.safetensors"]


# ------------------------------------------------------------------------------ the hub says no

@pytest.mark.slow
def test_hub_refusals_are_one_error_each_with_what_to_do(hub, hub_env):
    missing = one_error(run_sparkit(hub_env, "pull", "sparkit-test/no-such-model"), 9)
    assert f"no repository sparkit-test/no-such-model on {hub.url}" in missing and "HF_TOKEN" in missing
    revision = one_error(run_sparkit(hub_env, "pull", "sparkit-test/tiny-ling@v9"), 9)
    assert "sparkit-test/tiny-ling has no revision 'v9'" in revision and "ORG/NAME@REVISION" in revision
    gated = one_error(run_sparkit(hub_env, "pull", "sparkit-test/tiny-ling-gated"), 9)
    assert "sparkit-test/tiny-ling-gated is gated" in gated and f"{hub.url}/sparkit-test/tiny-ling-gated" in gated
    assert "export HF_TOKEN=" in gated and "config.json" in gated
    not_granted = one_error(run_sparkit({**hub_env, "HF_TOKEN": NOT_GRANTED}, "pull", "sparkit-test/tiny-ling-gated"), 9)
    assert "has not been granted access" in not_granted and "request access at" in not_granted
    bad_token = one_error(run_sparkit({**hub_env, "HF_TOKEN": "hf_expired"}, "pull", "sparkit-test/tiny-ling"), 9)
    assert f"{hub.url} refused the token (401" in bad_token
    private = one_error(run_sparkit(hub_env, "pull", "sparkit-test/tiny-ling-private"), 9)
    assert "no repository sparkit-test/tiny-ling-private" in private and "private" in private
    for repo in ("sparkit-test/tiny-ling-gated", "sparkit-test/tiny-ling-private"):
        assert not (Path(hub_env["HF_HUB_CACHE"]) / ("models--" + repo.replace("/", "--")) / "blobs").exists()


@pytest.mark.slow
def test_hf_token_opens_a_gated_repository_and_never_lands_in_a_file_or_leaves_the_hub(hub, hub_env, tmp_path):
    env = {**hub_env, "HF_TOKEN": TOKEN}
    done = run_sparkit(env, "pull", "sparkit-test/tiny-ling-gated", "--json")
    assert done.returncode == 0, done.stderr
    assert TOKEN not in done.stdout and TOKEN not in done.stderr
    for path in tmp_path.rglob("*"):  # the Hugging Face cache, SPARKIT_HOME: everything written
        if path.is_file() and not path.is_symlink():
            assert TOKEN.encode() not in path.read_bytes(), path
    requests = hub.stats()["requests"]
    assert any(r["token"] for r in requests if not r["cdn"])  # the hub got it
    assert not any(r["token"] for r in requests if r["cdn"])  # the signed CDN addresses did not


@pytest.mark.slow
def test_offline_and_no_network_are_errors_naming_the_repository_and_a_complete_copy_needs_neither(hub, hub_env):
    offline = one_error(run_sparkit({**hub_env, "HF_HUB_OFFLINE": "1"}, "pull", "sparkit-test/tiny-ling"), 9)
    assert "offline (HF_HUB_OFFLINE=1)" in offline and "sparkit-test/tiny-ling" in offline
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    down = one_error(run_sparkit({**hub_env, "HF_ENDPOINT": dead}, "pull", "sparkit-test/tiny-ling"), 9)
    assert f"cannot reach {dead}" in down and "check the network" in down
    assert run_sparkit(hub_env, "pull", "sparkit-test/tiny-ling").returncode == 0
    for env in ({**hub_env, "HF_HUB_OFFLINE": "1"}, {**hub_env, "HF_ENDPOINT": dead}):
        again = run_sparkit(env, "pull", "sparkit-test/tiny-ling")
        assert again.returncode == 0, again.stderr
        assert "checked against sparkit's record" in again.stderr and "nothing to fetch" in again.stderr
        checked = run_sparkit(env, "pull", "--check", "sparkit-test/tiny-ling")
        assert checked.returncode == 0 and checked.stderr.count("verify ") == 7
