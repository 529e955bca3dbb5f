"""`sparkit doctor --bandwidth` measures this host and plans use the figure; otherwise spec sheets."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sparkit.host import Gpu, Host
from sparkit.roofline.bandwidth import Measurement, gpu_spec, resolve_bandwidth, save_measurement, this_host


def sparkit(home, *args):
    env = {**os.environ, "SPARKIT_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "sparkit", *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.slow
def test_doctor_measures_the_cpu_stores_it_and_plans_use_it(tmp_path):
    done = sparkit(tmp_path, "doctor", "--bandwidth", "--bandwidth-mib", "32", "--json")
    assert done.returncode == 0, done.stderr
    memory = json.loads(done.stdout)["bandwidth"]
    cpu = next(m for m in memory["measured_now"] if m["device"] == "cpu")
    assert cpu["read_gb_s"] > 0 and cpu["copy_gb_s"] > 0 and cpu["buffer_bytes"] == 32 << 20
    stored = json.loads((tmp_path / "data" / "bandwidth.json").read_text())["measurements"]
    assert [m["read_gb_s"] for m in stored if m["device"] == "cpu"] == [cpu["read_gb_s"]]

    plan = sparkit(tmp_path, "plan", "tiny", "--set", "target=cpu", "--json")
    assert plan.returncode == 0, plan.stderr
    roofline = json.loads(plan.stdout)["roofline"]
    assert roofline["bandwidth"]["source"] == "measured"
    assert roofline["bandwidth"]["gb_s"] == cpu["read_gb_s"]
    assert roofline["limit_tok_s"] == pytest.approx(cpu["read_gb_s"] * 1e9 / roofline["step_bytes"])

    human = sparkit(tmp_path, "doctor")
    assert "cpu: read" in human.stdout and "stored in" in human.stdout


def test_a_measurement_from_another_host_is_not_used(sparkit_home):
    save_measurement(Measurement("some-other-host", "cpu", "x", 50.0, 60.0, 1 << 20, 1, "test", "2026-01-01"))
    bw = resolve_bandwidth("cpu", "cpu", 1, Host())
    assert bw.source == "unknown" and bw.gb_s is None
    save_measurement(Measurement(this_host(), "cpu", "x", 31.5, 40.0, 1 << 20, 1, "test", "2026-01-01"))
    assert resolve_bandwidth("cpu", "cpu", 1, Host()).gb_s == 31.5


@pytest.mark.parametrize("name, gb_s", [
    ("NVIDIA GB10", 273.0), ("NVIDIA H200", 4800.0), ("NVIDIA H100 80GB HBM3", 3350.0),
    ("NVIDIA H100 PCIe", 2000.0), ("NVIDIA B200", 8000.0), ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 1792.0),
])
def test_spec_sheets_by_device_name(name, gb_s):
    assert gpu_spec(name)[1] == gb_s


def gb10_host() -> Host:
    return Host(gpus=[Gpu(0, "NVIDIA GB10", (12, 1), None, unified_memory=True)])


def test_a_gpu_plan_uses_this_hosts_measurement_then_its_spec_then_the_targets(sparkit_home):
    assert resolve_bandwidth("gb10", "gpu", 1, gb10_host()).detail.startswith("273 GB/s: NVIDIA GB10")
    save_measurement(Measurement(this_host(), "cuda:0 NVIDIA GB10", "NVIDIA GB10", 241.0, 230.0, 1 << 30, None,
                                 "test", "2026-01-01"))
    measured = resolve_bandwidth("gb10", "gpu", 1, gb10_host())
    assert (measured.source, measured.gb_s) == ("measured", 241.0)
    h200 = Host(gpus=[Gpu(0, "NVIDIA H200", (9, 0), 141 << 30)])
    assert resolve_bandwidth("gb10", "gpu", 1, h200).gb_s == 273.0  # planning for a Spark elsewhere: its spec
    assert resolve_bandwidth("hopper", "gpu", 1, h200).gb_s == 4800.0  # the host's own part
    tp4 = resolve_bandwidth("blackwell-tp4", "gpu", 4, Host())
    assert (tp4.gb_s, tp4.devices) == (8000.0, 4) and "B200" in tp4.detail


def burners(count: int) -> list[subprocess.Popen]:
    """Real processes that each keep a core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def test_a_measurement_beside_busy_processes_says_the_machine_was_busy(sparkit_home):
    import math

    from sparkit.roofline.bandwidth import busy_threshold_cores, measure_cpu

    procs = burners(math.ceil(busy_threshold_cores(os.cpu_count())) + 1)
    try:
        m = measure_cpu(16 << 20, repeats=2, rounds=3, pause_s=0.2)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert m.busy is True and m.others_cpu_cores > busy_threshold_cores(m.cpu_count)
    assert m.rounds == 3 and m.load_avg_1m is not None and "a busy machine" in m.conditions()


@pytest.mark.slow
def test_doctor_warns_when_busy_and_every_roofline_line_says_when_and_under_what_load(tmp_path):
    import math

    from sparkit.roofline.bandwidth import busy_threshold_cores

    procs = burners(math.ceil(busy_threshold_cores(os.cpu_count())) + 1)
    try:
        done = sparkit(tmp_path, "doctor", "--bandwidth", "--bandwidth-mib", "16")
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert done.returncode == 0, done.stderr
    assert "warning: the machine was busy while measuring cpu" in " ".join(done.stderr.split())
    stored = json.loads((tmp_path / "data" / "bandwidth.json").read_text())["measurements"][0]
    assert stored["others_cpu_cores"] > 0 and stored["load_avg_1m"] is not None and stored["rounds"] == 5
    plan = sparkit(tmp_path, "plan", "tiny", "--set", "target=cpu")
    line = next(out for out in plan.stdout.splitlines() if out.strip().startswith("bandwidth "))
    assert f"at load {stored['load_avg_1m']:.1f}" in line and "a busy machine, so the figure may be low" in line
    assert "measured 20" in line and " UTC" in line


def stored(read: float, buffer: int = 1 << 28, **load) -> Measurement:
    return Measurement(this_host(), "cpu", "x", read, read * 1.5, buffer, 1, "test", "2026-12-01T20:00:00+00:00", **load)


def test_the_best_figure_of_the_same_measurement_is_kept(sparkit_home):
    from sparkit.roofline.bandwidth import keep_best, load_measurements

    assert keep_best(stored(6.5, load_avg_1m=2.5, others_cpu_cores=0.1, cpu_count=2))[0].read_gb_s == 6.5
    kept, _ = keep_best(stored(1.6, load_avg_1m=16.0, others_cpu_cores=1.9, cpu_count=2))
    assert kept.read_gb_s == 6.5 and [m.read_gb_s for m in load_measurements()] == [6.5]
    assert keep_best(stored(7.0))[0].read_gb_s == 7.0  # better: replaces
    # Another buffer size is another measurement (a small one may sit in the caches): it replaces.
    assert keep_best(stored(5.0, buffer=16 << 20))[0].read_gb_s == 5.0
    assert [m.read_gb_s for m in load_measurements()] == [5.0]


def test_a_figure_stored_before_loads_were_recorded_says_so(sparkit_home):
    save_measurement(stored(6.0))
    bw = resolve_bandwidth("cpu", "cpu", 1, Host())
    assert "measured 2026-12-01 20:00 UTC, load not recorded" in bw.detail
    save_measurement(stored(6.0, load_avg_1m=0.4, others_cpu_cores=0.05, cpu_count=8))
    detail = resolve_bandwidth("cpu", "cpu", 1, Host()).detail
    assert "at load 0.4, other processes using 0.1 of 8 cores" in detail and "busy" not in detail


def test_the_h200_recipe_reads_the_h200s_figure_not_the_hopper_reference_part(sparkit_home):
    """tp4-nextn-h200 runs on four H200s: planned on a host without them, its estimate used the
    hopper profile's reference part (H100 SXM, 3,350 GB/s) until the recipe could name its part."""
    from sparkit.recipes.load import load_recipe
    from sparkit.roofline.estimate import estimate

    assert resolve_bandwidth("hopper", "gpu", 4, Host()).gb_s == 3350.0  # the profile alone: its reference part
    named = resolve_bandwidth("hopper", "gpu", 4, Host(), "H200")
    assert (named.gb_s, named.devices) == (4800.0, 4) and "H200" in named.detail
    recipe = load_recipe("ling-3.0-flash/tp4-nextn-h200").recipe
    assert recipe.target_gpu == "H200"
    assert "4800 GB/s per GPU: NVIDIA H200" in estimate(recipe, host=Host()).bandwidth.detail


def test_an_unknown_target_gpu_is_refused_naming_the_file_line_and_key(tmp_path):
    from sparkit.errors import RecipeError
    from sparkit.recipes.load import load_recipe

    path = tmp_path / "mine.yaml"
    path.write_text("extends: ling-3.0-flash/tp4-nextn-h200\ntarget_gpu: H300\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(str(path))
    text = str(err.value)
    assert f"{path}:2" in text and "target_gpu" in text and "H300" in text and "H200" in text
