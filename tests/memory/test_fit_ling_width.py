"""The memory fit of Ling-3.0-flash at its own widths with few layers (what benchmarks/ling_width.py
serves on the H200 with `--load-format dummy`): weights from sparse headers or from config.json
alone (a config-only checkpoint, said so), SGLang's own pool sizing predicted at the free memory
it will measure, and a launch refused when the servers still starting will take that memory.
NVML is faked only at the hardware boundary (an H200's figures: 140.4 GiB, 139.8 GiB free)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import types

import pynvml
import pytest

from sparkit.checkpoint_headers import read_safetensors_index
from sparkit.host import detect_host
from sparkit.memory.fit import CUDA_CONTEXT_BYTES, compute_fit, memory_basis
from sparkit.memory.sglang_pool import PRE_POOL_BYTES
from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import load_recipe

from _shared import REPO_DIR

GIB = 1024**3
H200_TOTAL, H200_FREE = 150754820096, 150109880320  # `sparkit doctor` on the lent H200 (session 3)
KDA_STATE_PER_LAYER = 32 * 128 * 128 * 4 + 3 * 3 * 4096 * 2  # fp32 recurrent state + bf16 conv windows
FP8_HEAD_COPY = 157184 * 2560 + 157184 * 4


def _generator():
    spec = importlib.util.spec_from_file_location("make_sparse_ling", REPO_DIR / "scripts" / "make_sparse_ling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench():
    if "ling_width_bench" in sys.modules:
        return sys.modules["ling_width_bench"]
    spec = importlib.util.spec_from_file_location("ling_width_bench", REPO_DIR / "benchmarks" / "ling_width.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ling_width_bench"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    gen = _generator()
    root = tmp_path_factory.mktemp("ling-width")
    return {"L6": gen.write_checkpoint(root / "L6", "bf16", layers=6),
            "L6-config": gen.write_checkpoint(root / "L6-config", "bf16", layers=6, headers=False),
            "L12": gen.write_checkpoint(root / "L12", "bf16", layers=12)}


def h200(processes=None):
    """One H200 through a fake NVML module (the hardware boundary)."""
    def memory(handle):
        return types.SimpleNamespace(total=H200_TOTAL, free=H200_FREE, used=H200_TOTAL - H200_FREE)

    def running(handle):
        if processes is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in processes]

    nvml = types.SimpleNamespace(
        NVMLError=pynvml.NVMLError, NVMLError_NotSupported=pynvml.NVMLError_NotSupported,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlSystemGetDriverVersion=lambda: "580.159.04",
        nvmlSystemGetCudaDriverVersion=lambda: 13000, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetName=lambda h: "NVIDIA H200",
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0), nvmlDeviceGetUUID=lambda h: "GPU-0",
        nvmlDeviceGetMemoryInfo=memory, nvmlDeviceGetNvLinkState=lambda h, link: 0,
        nvmlDeviceGetComputeRunningProcesses=running,
    )
    return detect_host(nvml=nvml)


def variant_plan(tmp_path, name: str, model, **changes):
    import dataclasses

    bench = _bench()
    v = dataclasses.replace(next(x for x in bench.VARIANTS if x.name == name), **changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(bench.recipe_text(v, model, rehearse=False))
    return compile_plan(load_recipe(str(path), []))


def test_a_config_only_checkpoint_is_sized_from_its_config_and_says_so(models, tmp_path):
    headers = compute_fit(variant_plan(tmp_path, "A", models["L6"]), None)
    config_only = compute_fit(variant_plan(tmp_path, "A", models["L6-config"]), None)
    assert not list(models["L6-config"].glob("*.safetensors"))
    assert config_only.weights_bytes == headers.weights_bytes > 24 * GIB
    assert "no .safetensors files" in config_only.checkpoint_note and "declared BailingMoeV3 layout" in config_only.checkpoint_note
    assert "no .safetensors files" not in headers.checkpoint_note
    # a config sparkit declares no layout for: unknown, naming why, not a wrong figure
    other = tmp_path / "qwen"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 2,
                                                   "hidden_size": 64, "vocab_size": 100, "num_attention_heads": 2}))
    unknown = compute_fit(variant_plan(tmp_path, "A", other), None)
    assert unknown.verdict == "unknown" and "Qwen2ForCausalLM" in unknown.summary and "no .safetensors" in unknown.summary


def test_the_fit_predicts_the_pools_sglang_will_size_on_the_h200(models, tmp_path):
    """Variant A (6 layers, bf16 experts, FP8 head, mem_fraction_static 0.25): SGLang sizes the
    state pool itself. Recomputed here from the headers and SGLang's formulas."""
    plan = variant_plan(tmp_path, "A", models["L6"])
    fit = compute_fit(plan, memory_basis(plan, h200(processes=[])))
    weights = sum(t.nbytes for name, t in read_safetensors_index(models["L6"]).tensors.items()
                  if not name.startswith("model.layers.6.")) + FP8_HEAD_COPY  # NextN layer 6: not loaded
    assert fit.weights_bytes == weights
    p = H200_FREE - CUDA_CONTEXT_BYTES
    rest = p - weights - PRE_POOL_BYTES - p * (1 - 0.25)
    per_req = 5 * KDA_STATE_PER_LAYER  # 5 KDA layers of 6
    slots = int((rest * 0.9 / 1.9 - per_req) // per_req)
    predicted = fit.pools["predicted"]
    assert predicted["max_mamba_cache_size"] == slots and 300 < slots < 800
    assert predicted["kv_tokens"] == 16384  # --max-total-tokens
    assert predicted["ssm_state_gb"] == round((slots + 1) * 5 * 32 * 128 * 128 * 4 / GIB, 2)
    assert fit.verdict == "fits" and fit.engine_bytes > weights + slots * per_req
    assert any(line.startswith("state pool (0.9 / 1.9 of rest): max_mamba_cache_size") for line in fit.arithmetic)


def test_a_pool_sglang_cannot_size_is_refused_before_launch(models, tmp_path):
    """12 layers (59 GiB of bf16 weights) at mem_fraction_static 0.4: P x 0.6 stays free, the rest
    after the weights is negative, SGLang would stop in its memory profile: preflight exit 4."""
    from sparkit.checks.preflight import check_memory
    from sparkit.contract.checks import Status

    plan = variant_plan(tmp_path, "E", models["L12"], fraction=0.4)
    result = check_memory(plan, h200(processes=[]))
    assert result.status is Status.FAIL and "SGLang refuses to start" in result.detail
    assert result.fix.startswith("--set server.mem_fraction_static=0.4") and float(result.fix.split("=")[1].split()[0]) > 0.4
    # SGLang's own formula agrees, in its own words
    assert result.data["pools"]["error"].startswith("Loaded weights leave no GPU memory for the KV cache under "
                                                    "--mem-fraction-static=0.4")
    ok = check_memory(variant_plan(tmp_path, "E", models["L12"]), h200(processes=[]))  # at 0.85 it fits
    assert ok.status is Status.PASS, ok.detail


@pytest.fixture
def starting_runs(sparkit_home):
    """Two runs `sparkit up` is still starting (E and F of the benchmark): each a record in state
    starting owned by this live process, an engine that is a real process group, and the memory fit
    its preflight recorded (66 GiB on GPU 0)."""
    from sparkit.paths import ensure_dir
    from sparkit.runs.processes import ProcessIdentity
    from sparkit.runs.store import Run, RunFiles, RunState

    made = []
    for name in ("E", "F"):
        engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        run = Run(id=f"ling-width-{name}-starting", recipe_name=name, recipe_path=None, engine="sglang",
                  url="http://127.0.0.1:1", host="127.0.0.1", port=1, pid=engine.pid, pgid=engine.pid,
                  state=RunState.STARTING, owner=ProcessIdentity.of(os.getpid()).to_dict())
        ensure_dir(run.root)
        run.path.mkdir(mode=0o700)
        run.write_json(RunFiles.MEMORY, {"engine_bytes": 66 * GIB, "gpus": [0]})
        identity = ProcessIdentity.of(engine.pid)
        run.create_time, run.cmdline = identity.create_time, list(identity.cmdline)
        run.save()
        made.append((run, engine))
    yield made
    for _run, engine in made:
        engine.kill()
        engine.wait()


def test_servers_still_starting_keep_their_share_from_the_next_launch(models, tmp_path, starting_runs):
    """E and F (12 layers each) are starting and hold 10 GiB each of the 66 GiB they will take:
    NVML still shows 139.8 GiB free, but G (12 layers + NEXTN, 65 GiB of weights) must be judged
    against 139.8 - 2 x 56 GiB, and refused; once they are up (NVML shows them) nothing is reserved."""
    from sparkit.checks.preflight import check_memory
    from sparkit.contract.checks import Status
    from sparkit.runs.store import RunState

    (e, e_engine), (f, f_engine) = starting_runs
    plan = variant_plan(tmp_path, "G", models["L12"])
    host = h200(processes=[(e_engine.pid, 10 * GIB), (f_engine.pid, 10 * GIB), (os.getpid(), 3 * GIB)])
    basis = memory_basis(plan, host)
    assert basis.available_bytes == H200_FREE - 2 * 56 * GIB
    assert {(r["run_id"], r["held_bytes"]) for r in basis.reservations} == {(e.id, 10 * GIB), (f.id, 10 * GIB)}
    assert "2 server(s) still starting will take" in basis.source
    refused = check_memory(plan, host)
    assert refused.status is Status.FAIL and "does not fit" in refused.detail, refused.detail
    # with one of them starting, G fits beside it
    f.state = RunState.RUNNING
    f.save()
    assert memory_basis(plan, host).available_bytes == H200_FREE - 56 * GIB
    assert check_memory(plan, host).status is Status.PASS
    # NVML cannot list processes: all of E's 66 GiB are reserved
    assert memory_basis(plan, h200(processes=None)).available_bytes == H200_FREE - 66 * GIB
    # both up: their memory is in NVML's figure, nothing reserved
    e.state = RunState.RUNNING
    e.save()
    assert memory_basis(plan, host).available_bytes == H200_FREE and not memory_basis(plan, host).reservations


def test_what_a_starting_engine_holds_is_read_from_its_own_log_too(models, tmp_path, starting_runs):
    """In a container NVML often lists no process of ours: E's progress in its real log (SGLang's
    lines from the H200, tests/fixtures) says what it holds, priced by its fit: the target's weights
    after the first `Load weight end`, the pools after `Memory pool end`."""
    from sparkit.memory.fit import compute_fit as fit_of_plan
    from sparkit.memory.reservations import held_by_progress
    from sparkit.runs.store import RunFiles

    (e, _), (f, f_engine) = starting_runs
    from sparkit.memory.fit import MemoryBasis

    idle = MemoryBasis("gpu", H200_TOTAL, H200_FREE, "an idle H200, as E's preflight saw it", measured=True)
    record = {**fit_of_plan(variant_plan(tmp_path, "E", models["L12"]), idle).to_dict(), "gpus": [0]}
    e.write_json(RunFiles.MEMORY, record)
    lines = (REPO_DIR / "tests" / "fixtures" / "sglang-0.5.23-h200" / "v3-plain.log").read_text().splitlines()
    upto = lambda marker: "\n".join(lines[: next(i for i, line in enumerate(lines) if marker in line) + 1])  # noqa: E731
    weights = record["weights_bytes"]
    context = CUDA_CONTEXT_BYTES
    assert held_by_progress(record, "") == 0
    assert held_by_progress(record, upto("Load weight begin")) == context
    assert held_by_progress(record, upto("Load weight end")) == context + weights  # E has no draft
    sizes = record["pools"]["sizes"]
    pools = sizes["state_reserved_bytes"] + sizes["kv_bytes"] + sizes["req_to_token_bytes"]
    assert held_by_progress(record, upto("Memory pool end")) == context + weights + PRE_POOL_BYTES + pools
    e.log_path.write_text(upto("Load weight end"))
    plan = variant_plan(tmp_path, "G", models["L12"])
    basis = memory_basis(plan, h200(processes=[]))  # NVML lists nobody
    e_reservation = next(r for r in basis.reservations if r["run_id"] == e.id)
    assert e_reservation["held_bytes"] == context + weights
    assert e_reservation["reserved_bytes"] == record["engine_bytes"] - context - weights
    # an embedded engine's run holds host memory, not the GPU's: nothing reserved for it
    f.write_json(RunFiles.MEMORY, {"engine_bytes": 66 * GIB, "gpus": [0], "basis": {"kind": "host"}})
    assert [r["run_id"] for r in memory_basis(plan, h200(processes=[])).reservations] == [e.id]


def test_launches_check_memory_one_at_a_time(sparkit_home):
    """The launch lock: a second `up` waits while the first checks memory and records its run."""
    from sparkit.runs.store import launch_lock

    entered, trying = threading.Event(), threading.Event()

    def second():
        trying.set()
        with launch_lock():
            entered.set()

    with launch_lock() as release:
        worker = threading.Thread(target=second)
        worker.start()
        assert trying.wait(10)
        assert not entered.wait(0.5), "the second launch entered while the first held the lock"
        release()
        assert entered.wait(10)
    worker.join(10)


def test_the_launch_records_its_memory_fit_before_the_engine_is_up(sparkit_home, tmp_path):
    """launch() writes memory-fit.json and calls back (up releases its lock there) while the run is
    still starting: a stand-in engine that becomes healthy only after the callback ran."""
    from sparkit.contract.plan import Expectations, LaunchPlan
    from sparkit.runs import free_port, launch, stop
    from sparkit.runs.store import RunFiles, RunState

    port = free_port()
    standin = REPO_DIR / "tests" / "memory" / "standin_engine.py"
    (tmp_path / "ckpt").mkdir()
    plan = LaunchPlan(engine="embedded", argv=[sys.executable, str(standin), str(port), "8", "16", "1",
                                               str(tmp_path / "progress")],
                      env={}, host="127.0.0.1", port=port, model=str(tmp_path / "ckpt"), served_model_name="stand-in",
                      recipe_name="stand-in", recipe_path=None, expectations=Expectations(),
                      recipe={"server": {"memory_guard": False}})
    seen = {}

    def recorded(run):
        seen["state"] = run.state
        seen["fit"] = run.read_json(RunFiles.MEMORY)
        seen["pid"] = run.pid

    run = launch(plan, memory_fit={"engine_bytes": 123, "gpus": [0]}, on_recorded=recorded, timeout=60)
    try:
        assert seen == {"state": RunState.STARTING, "fit": {"engine_bytes": 123, "gpus": [0]}, "pid": None}
    finally:
        stop(run)
