"""Preflight checks from (plan, host), each failing for a real reason and passing."""

from __future__ import annotations

import importlib.util
import socket

import pytest

from sparkit.checks.preflight import run_preflight
from sparkit.contract.checks import Status
from sparkit.host import Gpu, Host, detect_host
from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import load_recipe

from _shared import REPO_DIR

GIB = 1024**3


def gb10_host(ram=128 * 10**9) -> Host:
    gpu = Gpu(0, "NVIDIA GB10", (12, 1), None, unified_memory=True, memory_note="unified, NVML cannot report")
    return Host(gpus=[gpu], nvml_status="ok", ram_total_bytes=ram, ram_available_bytes=ram, cpu_cores=20)


def by_name(results):
    return {r.name: r for r in results}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tiny_passes_on_this_host():
    plan = compile_plan(load_recipe("tiny"), port=free_port())
    results = by_name(run_preflight(plan, detect_host()))
    assert [r.name for r in run_preflight(plan, detect_host())] == ["gpus", "memory_now", "memory", "port", "model",
                                                                    "state_space", "code_env", "engine_packages"]
    assert all(r.status == Status.PASS for r in results.values()), results


def test_gb10_recipe_on_a_host_without_gpu_fails_gpus():
    plan = compile_plan(load_recipe("ling-3.0-flash/spark-optimized"), port=free_port())
    host = Host(nvml_status="no NVIDIA driver (NVML Shared Library Not Found)", ram_total_bytes=16 * GIB)
    gpus = by_name(run_preflight(plan, host))["gpus"]
    assert gpus.status == Status.FAIL and "needs 1 GPU(s), found 0" in gpus.detail and gpus.fix


@pytest.fixture(scope="module")
def ling_fp4(tmp_path_factory):
    """Ling-3.0-flash-fp4's headers over holes (scripts/make_sparse_ling.py): the real arithmetic."""
    spec = importlib.util.spec_from_file_location("make_sparse_ling", REPO_DIR / "scripts" / "make_sparse_ling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_checkpoint(tmp_path_factory.mktemp("ling-fp4"), "fp4")


@pytest.mark.slow
def test_gb10_recipe_on_gb10_fits_unified_memory(ling_fp4):
    plan = compile_plan(load_recipe("ling-3.0-flash/spark-optimized", [f"model.path={ling_fp4}"]), port=free_port())
    results = by_name(run_preflight(plan, gb10_host(ram=120 * GIB)))
    assert results["gpus"].status == Status.PASS
    mem = results["memory"]
    assert mem.status == Status.PASS and mem.detail.startswith("fits: mem_fraction_static 0.68 is within")
    assert mem.data["basis"]["kind"] == "unified" and mem.data["verdict"] == "fits"
    # The same checkpoint on a 64 GiB box does not fit at any fraction.
    small = by_name(run_preflight(plan, gb10_host(ram=64 * GIB)))["memory"]
    assert small.status == Status.FAIL and small.data["verdict"] == "does-not-fit" and "does not fit" in small.detail
    # A fraction that would take the OS's share on unified memory fails, naming the one that fits.
    now = results["memory_now"]  # the picture on unified memory: what CUDA and NVML would claim, beside MemAvailable
    assert now.status == Status.PASS and "CUDA would report ~" in now.detail and "NVML none (NotSupported)" in now.detail
    assert any("counts the page cache as used" in line for line in now.evidence)
    greedy = compile_plan(load_recipe("ling-3.0-flash/spark-optimized", [f"model.path={ling_fp4}",
                                                                         "server.mem_fraction_static=0.92"]))
    too_much = by_name(run_preflight(greedy, gb10_host(ram=120 * GIB)))["memory"]
    assert too_much.status == Status.FAIL and "machine can hang" in too_much.cause
    assert f"--set server.mem_fraction_static={too_much.data['max_fraction']}" in too_much.fix


def test_a_hub_checkpoint_that_is_not_here_is_fitted_from_its_declared_profile_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    plan = compile_plan(load_recipe("ling-3.0-flash/spark-optimized"), port=free_port())
    mem = by_name(run_preflight(plan, gb10_host(ram=120 * GIB)))["memory"]
    assert mem.status == Status.PASS and mem.data["checkpoint_note"].startswith("sparkit's declared profile of")
    plan = compile_plan(load_recipe("ling-3.0-flash/spark-optimized", ["model.path=someorg/unprofiled"]), port=free_port())
    mem = by_name(run_preflight(plan, gb10_host()))["memory"]
    assert mem.status == Status.WARN and "cannot read the checkpoint someorg/unprofiled" in mem.detail
    assert "`sparkit pull someorg/unprofiled`" in mem.fix


def test_memory_now_fails_under_the_guard_floor_and_passes_with_the_guard_off():
    from sparkit.memory.meminfo import read_meminfo

    high = (read_meminfo().total + 8 * GIB) / GIB
    plan = compile_plan(load_recipe("tiny", [f"server.memory_guard.floor_gib={high}"]), port=free_port())
    now = by_name(run_preflight(plan, detect_host()))["memory_now"]
    assert now.status == Status.FAIL and "under the memory guard's floor" in now.detail and now.fix
    off = compile_plan(load_recipe("tiny", [f"server.memory_guard.floor_gib={high}", "server.memory_guard.enabled=false"]))
    assert by_name(run_preflight(off, detect_host()))["memory_now"].status == Status.PASS


def test_port_in_use_fails():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        plan = compile_plan(load_recipe("tiny"), port=port)
        result = by_name(run_preflight(plan, detect_host()))["port"]
        assert result.status == Status.FAIL and f"127.0.0.1:{port} is in use" in result.detail
    assert by_name(run_preflight(plan, detect_host()))["port"].status == Status.PASS


def test_model_path_missing_fails_and_a_hub_id_not_here_fails_with_the_pull_command(tmp_path, monkeypatch):
    missing = tmp_path / "no-such-checkpoint"
    plan = compile_plan(load_recipe("ling-3.0-flash/spark-baseline", [f"model.path={missing}"]), port=free_port())
    model = by_name(run_preflight(plan, gb10_host()))["model"]
    assert model.status == Status.FAIL and "neither a local directory nor a hub id" in model.detail
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    plan = compile_plan(load_recipe("ling-3.0-flash/tp4-dspark"), port=free_port())
    model = by_name(run_preflight(plan, gb10_host()))["model"]
    assert model.status == Status.FAIL and "inclusionAI/Ling-3.0-flash (target) is not here" in model.detail
    assert "inclusionAI/Ling-3.0-flash-dspark (draft) is not here" in model.detail
    assert model.fix.startswith("`sparkit pull inclusionAI/Ling-3.0-flash inclusionAI/Ling-3.0-flash-dspark`")
    assert "never downloads inside a launch" in model.cause
    (tmp_path / "empty").mkdir()
    plan = compile_plan(load_recipe("ling-3.0-flash/spark-baseline", [f"model.path={tmp_path / 'empty'}"]))
    assert by_name(run_preflight(plan, gb10_host()))["model"].status == Status.FAIL


@pytest.mark.slow
def test_engine_packages(monkeypatch):
    plan = compile_plan(load_recipe("ling-3.0-flash/spark-baseline"), port=free_port())
    assert by_name(run_preflight(plan, gb10_host()))["engine_packages"].status == Status.PASS
    import importlib.util

    real = importlib.util.find_spec
    # sglang missing is simulated at the import boundary: find_spec says it is not there.
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a))
    result = by_name(run_preflight(plan, gb10_host()))["engine_packages"]
    assert result.status == Status.FAIL and result.fix == "pip install sglang"


@pytest.mark.slow
def test_speculative_sglang_without_flashinfer_warns_that_sampled_requests_crash():
    """Seen on the H200: SGLang 0.5.23's NEXTN verify imports flashinfer for temperature > 0
    (flashinfer is not installed in the test environment; with it, the pair is judged on its
    source: tests/sglang_plugin/test_compat.py)."""
    assert importlib.util.find_spec("flashinfer") is None
    nextn = compile_plan(load_recipe("ling-3.0-flash/spark-optimized"), port=free_port())
    results = by_name(run_preflight(nextn, gb10_host()))
    assert results["engine_packages"].status == Status.PASS
    result = results["compat:flashinfer-sampling"]
    assert result.status == Status.WARN and "temperature > 0" in result.detail and "flashinfer" in result.fix
    assert result.title == "sglang 0.5.23 -> flashinfer-python not installed"
    plain = compile_plan(load_recipe("ling-3.0-flash/spark-baseline"), port=free_port())
    assert "compat:flashinfer-sampling" not in by_name(run_preflight(plain, gb10_host()))


def test_a_port_left_in_time_wait_by_a_stopped_server_is_free():
    """`up` right after `down` on the same port: the stopped server's connections linger in
    TIME_WAIT (the server closed them first); the port is free for the next server, as uvicorn
    binds it (SO_REUSEADDR). A live listener still fails the check."""
    import time

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's listener (and SGLang's)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    clients = []
    for _ in range(3):
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = listener.accept()
        conn.close()  # the server side closes first: its end goes to TIME_WAIT
        clients.append(client)
    time.sleep(0.1)
    for client in clients:
        client.close()
    plan = compile_plan(load_recipe("tiny"), port=port)
    assert by_name(run_preflight(plan, detect_host()))["port"].status == Status.FAIL  # still listening
    listener.close()
    with socket.socket() as plain:  # what the check used to do: a bind without SO_REUSEADDR fails
        try:
            plain.bind(("127.0.0.1", port))
            time_wait_blocks_a_plain_bind = False
        except OSError:
            time_wait_blocks_a_plain_bind = True
    assert time_wait_blocks_a_plain_bind, "no TIME_WAIT socket was left: the test did not reproduce the case"
    assert by_name(run_preflight(plan, detect_host()))["port"].status == Status.PASS


def h200_host(count: int) -> Host:
    gpus = [Gpu(i, "NVIDIA H200", (9, 0), 141 * GIB) for i in range(count)]
    return Host(gpus=gpus, nvml_status="ok", ram_total_bytes=512 * GIB, ram_available_bytes=500 * GIB, cpu_cores=64)


@pytest.mark.parametrize("recipe, tp", [("tiny/tiny-sglang-tp2", 2), ("ling-3.0-flash/tp4-nextn-h200", 4)])
def test_a_tp_plan_needs_as_many_gpus_as_ranks(recipe, tp):
    """The H200 TP recipes target `hopper` (one GPU or more): the GPU count comes from stack.tp."""
    plan = compile_plan(load_recipe(recipe), port=free_port())
    short = by_name(run_preflight(plan, h200_host(tp - 1)))["gpus"]
    assert short.status == Status.FAIL and f"stack.tp {tp} needs {tp} GPUs, found {tp - 1}" in short.detail
    assert f"--set stack.tp={tp - 1}" in short.fix
    enough = by_name(run_preflight(plan, h200_host(tp)))["gpus"]
    assert enough.status == Status.PASS, enough.detail
