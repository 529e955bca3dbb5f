"""Issue 40, item 6: `sparkit pull` ends on INT, TERM and HUP within the time it takes to hang
up, whatever the hub does: a body that trickles one byte at a time (huggingface_hub's http_get
buffers 10 MiB before its sink sees a byte, so Ctrl-C waited for the trickle), and a repository of
20,000 files (the pool's futures deadlocked on Ctrl-C, and every queued file still got its HEAD
and GET). What finished stays verified, what arrived of the file in flight stays for the next pull,
nothing is half-linked, and it exits 130."""

from __future__ import annotations

import json
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _hub import Pulling, run_sparkit, served_files

TINY = "sparkit-test/tiny-ling"
MiB = 1024 * 1024


def wait_for(predicate, what: str, proc, limit: float = 300) -> None:
    """Poll `predicate` until it holds (`limit` only ends a test that hangs)."""
    deadline = time.monotonic() + limit
    while not predicate():
        assert proc.poll() is None, f"sparkit pull ended before {what}"
        assert time.monotonic() < deadline, f"no {what} in {limit} s"
        time.sleep(0.05)


def blobs(env: dict, repo: str) -> Path:
    return Path(env["HF_HUB_CACHE"]) / ("models--" + repo.replace("/", "--")) / "blobs"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["INT", "TERM", "HUP"])
def test_a_trickling_body_is_left_at_once_on_a_signal_keeping_what_arrived(hub, hub_env, sig):
    hub.control(op="trickle", path="model.safetensors", after=MiB, every=1.0)
    pulling = Pulling(hub_env, TINY, "--workers", "1")
    wait_for(lambda: hub.stats()["blocked"].get("model.safetensors"), "the trickle", pulling.proc)
    pulling.proc.send_signal(sig)
    pulling.until(lambda line: line.startswith("stopping:"), "it said it was stopping")
    text = pulling.wait()  # while the hub still trickles: the trickle ends only at "release", below
    assert pulling.proc.returncode == 130, text
    assert "6 of 7 files verified and kept; model.safetensors kept at 1.0 MiB" in text, text
    assert "Traceback" not in text
    (partial,) = blobs(hub_env, TINY).glob("*.incomplete")
    kept = partial.stat().st_size
    assert kept >= MiB  # what arrived is on disk, not in a buffer that died with the process
    snapshot_dir = blobs(hub_env, TINY).parent / "snapshots"
    assert not snapshot_dir.exists() or not any(snapshot_dir.rglob("*"))  # nothing linked before it is complete
    hub.control(op="release")
    resumed = run_sparkit(hub_env, "pull", TINY)
    assert resumed.returncode == 0, resumed.stderr
    assert "model.safetensors  5.1 MiB (resuming at 1.0 MiB)" in resumed.stderr
    size = (blobs(hub_env, TINY) / partial.name.removesuffix(".incomplete")).stat().st_size
    assert served_files(hub, TINY)["model.safetensors"] - size < 64 * 1024  # at most what was in flight, twice


def tiny_weights() -> bytes:
    raw = json.dumps({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"\0" * 8


@pytest.mark.slow
def test_ctrl_c_with_20000_files_queued_ends_at_once_and_asks_for_no_more_files(hub, hub_env):
    repo, workers = "hostile/many", 4
    commit = hub.add_repo(repo, {"config.json": '{"architectures": ["X"]}', "model.safetensors": tiny_weights()},
                          generate={"count": 20_000, "pattern": "extra-{:05d}.json"})
    pulling = Pulling(hub_env, repo, "--workers", str(workers))
    verified = []
    pulling.until(lambda line: line.startswith("ok ") and verified.append(line) is None and len(verified) >= 20,
                  "20 files were verified")
    pulling.proc.send_signal(signal.SIGINT)
    text = pulling.wait()
    assert pulling.proc.returncode == 130, text[-3000:]
    assert "of 20002 files verified and kept" in text and f"`sparkit pull {repo}` resumes" in text
    record = json.loads((Path(hub_env["SPARKIT_HOME"]) / "cache" / "pulls" / "models--hostile--many"
                         / f"{commit}.json").read_text())
    kept = sum(1 for entry in record["files"].values() if entry["verified"])
    asked = [r for r in hub.stats()["requests"] if f"/{repo}/resolve/" in r["path"]]
    # Files asked for: those verified, those in flight when Ctrl-C came (one per worker), and
    # config.json's read while planning; none of the ~20,000 still queued.
    assert len([r for r in asked if r["method"] == "HEAD"]) <= kept + workers
    assert len([r for r in asked if r["method"] == "GET"]) <= kept + workers + 1


@pytest.mark.slow
def test_ctrl_c_while_plan_reads_headers_from_a_hub_that_trickles_them_ends_at_once(hub, hub_env, tmp_path):
    """The memory fit of a hub model (`sparkit plan`, and `sparkit pull RECIPE` before it pulls)
    reads the safetensors headers by range requests on threads: Ctrl-C waited for each to end."""
    hub.control(op="trickle", path="model.safetensors", after=4, every=1.0)
    recipe = tmp_path / "hub-tiny.yaml"
    recipe.write_text(f"extends: tiny\nmodel:\n  path: {TINY}\n")
    proc = subprocess.Popen([sys.executable, "-m", "sparkit", "plan", str(recipe)], env=hub_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: hub.stats()["blocked"].get("model.safetensors"), "the trickle", proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)  # the hub still trickles: only the plan's own exit ends this
        assert proc.returncode == 130, err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
