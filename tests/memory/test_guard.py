"""The load guard stopping a real engine process: the stand-in allocates memory step by step (as
an engine loading weights does) while `launch` waits for it; with the floor 512 MiB under what is
available now, the guard stops it before it has allocated its 1.5 GiB, and `launch` fails with the
peak, the floor and the setting to change. With the floor far below, the same load completes.
Memory used stays about a GiB (the CI machine has 24 GiB)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import psutil
import pytest

from sparkit.contract.plan import Expectations, LaunchPlan
from sparkit.errors import LaunchError
from sparkit.memory.meminfo import read_meminfo
from sparkit.runs import free_port, launch, list_runs, stop

GIB, MIB = 1024**3, 1024**2
STANDIN = Path(__file__).with_name("standin_engine.py")


def standin_plan(tmp_path, *, floor_bytes: int, max_mib: int, healthy: bool, model_dir: Path) -> LaunchPlan:
    port = free_port()
    progress = tmp_path / "allocated"
    return LaunchPlan(
        engine="embedded", argv=[sys.executable, str(STANDIN), str(port), "32", str(max_mib), "1" if healthy else "0",
                                 str(progress)],
        env={}, host="127.0.0.1", port=port, model=str(model_dir), served_model_name="stand-in",
        recipe_name="stand-in", recipe_path=None, expectations=Expectations(),
        recipe={"server": {"memory_guard": {"enabled": True, "floor_gib": floor_bytes / GIB}}},
    )


@pytest.fixture
def model_dir(tmp_path):
    """A checkpoint directory with one weight file in the page cache (the guard's eviction target)."""
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    weights = directory / "model.safetensors"
    with open(weights, "wb") as handle:
        handle.write(os.urandom(32 * MIB))
        handle.flush()
        os.fsync(handle.fileno())
    return directory


def group_alive(pgid: int) -> bool:
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return False


def test_the_guard_stops_an_engine_whose_load_crosses_the_floor(sparkit_home, tmp_path, model_dir):
    floor = read_meminfo().available - 512 * MIB
    plan = standin_plan(tmp_path, floor_bytes=floor, max_mib=1536, healthy=False, model_dir=model_dir)
    with pytest.raises(LaunchError) as caught:
        launch(plan, timeout=300)
    message = str(caught.value)
    assert "the memory guard stopped the engine while loading weights" in message
    assert f"under the floor of {floor / GIB:.2f} GiB" in message and "peak use" in message
    assert "server.mem_fraction_static" in message and "server.memory_guard.floor_gib" in message
    run = list_runs()[-1]
    meta = run
    assert meta.state.value == "failed" and meta.failure == "stopped by the memory guard"
    assert not group_alive(meta.pgid), "the stopped engine left processes behind"
    allocated = int((tmp_path / "allocated").read_text())
    assert allocated < 1536 * MIB, "the stand-in finished its load: the guard did not stop it"
    guard = meta.memory_guard
    assert guard["stopped"] and guard["stopped_at_available"] < floor and guard["peak_used"] > 0
    events = [json.loads(line) for line in (run.path / "memory-guard.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and "stop" in kinds and kinds[-1] == "end"
    # Before stopping, the guard tried the page cache: an eviction pass precedes the stop.
    assert "evict" in kinds[:kinds.index("stop")]
    stop_event = events[kinds.index("stop")]
    assert stop_event["available"] < floor and stop_event["signal"] == "SIGTERM"


def test_a_load_that_stays_above_the_floor_completes(sparkit_home, tmp_path, model_dir):
    floor = 1 * GIB
    assert read_meminfo().available > floor + 4 * GIB, "this machine has too little memory free for the test"
    plan = standin_plan(tmp_path, floor_bytes=floor, max_mib=512, healthy=True, model_dir=model_dir)
    run = launch(plan, timeout=300)
    try:
        guard = run.reload().memory_guard
        assert guard["enabled"] and not guard["stopped"] and guard["samples"] > 0
        assert guard["floor_bytes"] == floor and guard["files"] == 1
        assert int((tmp_path / "allocated").read_text()) == 512 * MIB
    finally:
        stop(run)


def test_the_guard_is_off_with_the_recipe_key(sparkit_home, tmp_path, model_dir):
    plan = standin_plan(tmp_path, floor_bytes=1 * GIB, max_mib=32, healthy=True, model_dir=model_dir)
    plan.recipe["server"]["memory_guard"]["enabled"] = False
    run = launch(plan, timeout=300)
    try:
        assert run.reload().memory_guard == {"enabled": False, "reason": "server.memory_guard.enabled is false"}
        assert not (run.path / "memory-guard.jsonl").exists()
    finally:
        stop(run)
