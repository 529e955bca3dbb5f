"""Page-cache residency and eviction on real files, measured with mincore; the load guard's
eviction step against a file it really evicts."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from sparkit.memory.guard import LoadGuard
from sparkit.memory.pagecache import evict_files, residency, resident_bytes, weight_files

MIB = 1024**2


def cached_file(tmp_path, name="model-00001-of-00001.safetensors", size=64 * MIB):
    path = tmp_path / name
    with open(path, "wb") as handle:
        handle.write(os.urandom(size))
        handle.flush()
        os.fsync(handle.fileno())  # clean pages: DONTNEED drops only clean ones
    with open(path, "rb") as handle:
        while handle.read(8 * MIB):
            pass
    return path


def test_a_read_file_is_resident_and_eviction_drops_it(tmp_path):
    path = cached_file(tmp_path)
    assert resident_bytes(path) > 0.9 * path.stat().st_size
    evicted = evict_files([path])
    assert resident_bytes(path) < 0.05 * path.stat().st_size
    assert evicted > 0.9 * path.stat().st_size
    with open(path, "rb") as handle:  # reading part of it brings that part back (plus the kernel's readahead)
        handle.read(16 * MIB)
    assert 16 * MIB <= resident_bytes(path) < 0.75 * path.stat().st_size


def test_weight_files_are_the_checkpoint_weights_resolved_through_symlinks(tmp_path):
    blob = cached_file(tmp_path, "blob")
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "model.safetensors").symlink_to(blob)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "tokenizer.json").write_text("{}")
    assert weight_files([snapshot, snapshot]) == [blob.resolve()]
    assert residency([blob])[1] == blob.stat().st_size


def sleeper():
    """A real process in its own group for the guard to watch (it must never be signalled here)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)


def run_guard(tmp_path, files, evict_below, samples=30):
    proc = sleeper()
    try:
        guard = LoadGuard(pgid=proc.pid, files=files, floor_bytes=0, evict_below=evict_below, stop_below=0,
                          log_path=tmp_path / "memory-guard.jsonl", interval_s=0.02, evict_every=1).start()
        deadline = time.monotonic() + 60  # a failure timeout only: the test waits for sample counts
        while guard.summary.samples < samples and time.monotonic() < deadline:
            time.sleep(0.02)
        summary = guard.stop()
        assert proc.poll() is None, "the guard must not stop an engine that stays above the floor"
        return summary
    finally:
        proc.kill()
        proc.wait()


def test_the_guard_evicts_the_checkpoint_when_free_memory_is_under_its_floor(tmp_path):
    path = cached_file(tmp_path)
    before = resident_bytes(path)
    summary = run_guard(tmp_path, [path], evict_below=1 << 62)  # MemFree is always under this floor
    assert summary.evictions >= 1 and summary.evicted_bytes >= 0.9 * before
    assert resident_bytes(path) < 0.05 * path.stat().st_size
    events = [e["event"] for e in summary.events]
    assert events[0] == "start" and "evict" in events and events[-1] == "end" and "stop" not in events
    logged = (tmp_path / "memory-guard.jsonl").read_text().splitlines()
    assert len(logged) == len(summary.events) and '"evict"' in logged[events.index("evict")]


def test_the_guard_leaves_the_cache_alone_above_its_floor(tmp_path):
    path = cached_file(tmp_path)
    summary = run_guard(tmp_path, [path], evict_below=0)
    assert summary.evictions == 0 and summary.samples >= 30
    assert resident_bytes(path) > 0.9 * path.stat().st_size
