"""benchmarks/host_gap.py's own logic, on the CPU (issue 38): the recipes it serves compile to the
launch each A/B means (checked by SGLang 0.5.23's own parser in compile_plan), a switch is judged
against the two bases around it on the same machine with the bases' spread as the noise band, the
budget refuses a bracket it cannot close, and the whole study runs end to end with the embedded
engine standing in (--rehearse), stopping at its budget and continuing from its results."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import load_recipe

from _shared import REPO_DIR


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(REPO_DIR / "benchmarks"))
    spec = importlib.util.spec_from_file_location("host_gap_bench", REPO_DIR / "benchmarks" / "host_gap.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["host_gap_bench"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_every_server_compiles_to_the_launch_it_means(bench, tmp_path):
    pytest.importorskip("sglang")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    plain, nextn = bench.PHASES["plain6"], bench.PHASES["nextn6"]
    cases = [bench.variant(plain, "base"), bench.variant(plain, "switch", ("glue",)),
             bench.variant(plain, "switch", ("recv",)), bench.variant(plain, "best", ("glue", "delay", "recv")),
             bench.variant(nextn, "switch", ("kda",)), bench.variant(nextn, "switch", ("plan",))]
    for v in cases:
        path = tmp_path / f"{v.name}.yaml"
        path.write_text(bench.recipe_text(v, model, rehearse=False))
        plan = compile_plan(load_recipe(str(path), []))
        argv = plan.argv
        assert argv[argv.index("--load-format") + 1] == "dummy"
        assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "1"
        assert ("--speculative-algorithm" in argv) is v.speculative, v.name
        assert plan.recipe["stack"]["lm_head"] == "fp8" and plan.recipe["stack"]["weights"] == "fp8"
        assert plan.env["SPARKIT_FP8_TUNE"] == "0"
        for label in v.switches:
            for name, value in bench.SWITCHES[label].env.items():
                assert plan.env[name] == value, (v.name, name)
            flags = bench.SWITCHES[label].flags
            if flags:
                assert argv[argv.index(flags[0]) + 1] == flags[1]
        if any(n.startswith("SGLANG_") for n in v.env):  # the plugin reports them: the check can prove them
            assert any(p.optimisation == "engine_switches=reported" for p in plan.provisions), v.name
    best = bench.variant(plain, "best", ("glue", "delay"))
    assert best.env["SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW"] == "1"  # the glue graph's companion joins the best
    assert "SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW" not in bench.variant(plain, "switch", ("glue",)).env


def _session(bench, tmp_path, servers):
    """A session whose results hold `servers`: (name, tok/s or None, machine), in the order they ran."""
    import ling_width as lw

    session = lw.Session(tmp_path / "out", 600)
    session.results = {"variants": {}, "order": [], "phases": {}, "calls": [{"order_at_start": 0}], "notes": []}
    for name, speed, machine in servers:
        phase, role = name.split(".")[0], ("base" if ".base." in name else "best" if name.endswith(".best") else "switch")
        switch = () if role == "base" else (("glue", "delay") if role == "best" else (name.split(".")[1],))
        session.results["variants"][name] = {
            "phase": phase, "role": role, "switches": list(switch), "machine": machine, "done": True,
            "layers": 12 if phase == "l12" else 6, "speculative": phase == "nextn6", "total_s": 90.0,
            "verdict_up": "checks pass" if speed else "not measured: sparkit up exit 6, failed known_answer",
            "decode": {"decode_tok_s": speed, "tpot_median_ms": 1000.0 / speed if speed else None}}
        session.results["order"].append(name)
    return session


def test_a_switch_is_judged_against_the_bases_around_it_on_its_machine(bench, tmp_path):
    session = _session(bench, tmp_path, [
        ("plain6.base.start", 400.0, "m1"), ("plain6.glue", 560.0, "m1"), ("plain6.base.glue", 410.0, "m1"),
        ("plain6.delay", 412.0, "m1"), ("plain6.base.delay", 404.0, "m1"), ("plain6.fill", 380.0, "m1"),
        ("plain6.base.fill", 402.0, "m1"), ("plain6.recv", None, "m1"), ("plain6.base.recv", 401.0, "m1"),
        ("plain6.affinity", 500.0, "m1"), ("plain6.base.restart", 420.0, "m2")])
    band = bench.noise_band(session, "plain6")
    assert band == pytest.approx(10 / 405)  # the largest spread of consecutive bases on one machine (not m1 -> m2)
    rows = {r["name"]: bench.judge(session, r, band) for r in bench.brackets(session, "plain6")}
    assert rows["plain6.glue"]["before"] == "plain6.base.start" and rows["plain6.glue"]["after"] == "plain6.base.glue"
    assert rows["plain6.glue"]["verdict"].startswith("faster +38.3%")
    assert rows["plain6.delay"]["verdict"].startswith("within noise")
    assert rows["plain6.fill"]["verdict"].startswith("slower")
    assert rows["plain6.recv"]["verdict"].startswith("rejected: not measured") and "known_answer" in rows["plain6.recv"]["verdict"]
    # its closing base ran on another machine: another Triton cache, another load; not a bracket
    assert rows["plain6.affinity"]["after"] is None and rows["plain6.affinity"]["verdict"].startswith("open bracket")
    assert bench.winners(session, "plain6") == ("glue",)
    lines = bench.table(session)
    assert lines[0].startswith("plain6: noise band ±2.5%")
    assert any(line.split()[:2] == ["glue", "400.0"] and "faster" in line for line in lines)


class _Args:
    rehearse = False
    max_servers = None


def test_the_budget_starts_no_bracket_it_cannot_close(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "machine_id", lambda: "m1")
    session = _session(bench, tmp_path, [])
    plain, nextn = bench.PHASES["plain6"], bench.PHASES["nextn6"]
    base, glue = bench.variant(plain, "base"), bench.variant(plain, "switch", ("glue",))
    e = bench.ESTIMATE_S
    # a cold machine: the first server compiles the kernels, the next of the same family does not
    assert bench.estimate_s(session, base, False) == e["cold"]
    assert bench.estimate_s(session, glue, False, (base,)) == e["plain"]
    assert bench.estimate_s(session, bench.variant(nextn, "base"), False) == e["nextn-cold"]
    session.budget_s = e["cold"] + e["plain"] + 15.0 + 5
    assert bench.fits(session, [base, glue], _Args()) == (True, "")
    session.budget_s -= 10
    ok, why = bench.fits(session, [base, glue], _Args())
    assert not ok and why.endswith(f"2 server(s) need ~{e['cold'] + e['plain'] + 15.0:.0f} s")
    limited = _Args()
    limited.max_servers = 1
    assert bench.fits(session, [base, glue], limited) == (False, "--max-servers 1: this call ran 0, this needs 2 more")
    session = _session(bench, tmp_path, [("plain6.base.start", 400.0, "m1")])
    session.results["variants"]["plain6.base.start"]["compiled"] = True
    session.results["variants"]["plain6.base.start"]["total_s"] = 170.0
    assert bench.estimate_s(session, glue, False) == e["plain"]  # the cold one is not a warm figure
    assert bench.estimate_s(session, bench.variant(nextn, "base"), False) == e["nextn-first"]
    session.results["order"].append("plain6.glue")
    session.results["variants"]["plain6.glue"] = {**session.results["variants"]["plain6.base.start"],
                                                  "compiled": False, "total_s": 80.0, "role": "switch",
                                                  "switches": ["glue"]}
    assert bench.estimate_s(session, bench.variant(plain, "base", after="glue"), False) == 80.0  # measured here
    session.budget_s = 0.0  # nothing left: refused and said, nothing starts
    how = bench.run_chain(session, plain, ("delay",), tmp_path, {}, _Args())
    assert how.startswith("stopped: ") and how.endswith("(the base that closes plain6.glue)")
    assert session.results["order"] == ["plain6.base.start", "plain6.glue"]


@pytest.mark.slow
@pytest.mark.e2e
def test_the_rehearsal_runs_stops_at_its_budget_and_continues(bench, tmp_path):
    """The real control flow on this CPU: embedded servers one at a time through `sparkit up` and
    `sparkit down`, decode, /start_profile; a budget for one bracket only, then a second call that
    continues from the first's results (the same machine)."""
    out = tmp_path / "hg"
    env = {**os.environ, "SPARKIT_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_DIR)}
    (tmp_path / "home").mkdir(mode=0o700)

    def call(*extra):
        done = subprocess.run([sys.executable, str(REPO_DIR / "benchmarks" / "host_gap.py"), "--rehearse", "--out",
                               str(out), "--phases", "plain6", *extra], capture_output=True, text=True, timeout=900,
                              env=env, cwd=REPO_DIR)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return json.loads((out / "results.json").read_text()), done.stdout

    first, text = call("--switches", "glue,delay", "--max-servers", "3")
    assert first["order"] == ["plain6.base.start", "plain6.glue", "plain6.base.glue"]
    assert first["phases"]["plain6"] == "stopped before delay: --max-servers 3: this call ran 3, this needs 2 more"
    for name in first["order"]:
        record = first["variants"][name]
        assert record["verdict_up"] == "checks pass" and record["decode"]["decode_tok_s"] > 0
        assert record["decode"]["side_by_side"] is None  # measured alone
        assert "profile" in record and record["profile"]["breakdown"]["busy_us"] > 0, (name, record.get("profile_error"), text[-2000:])
    assert "glue" in (out / "table.txt").read_text()
    second, text = call("--switches", "glue,delay", "--max-servers", "2")
    assert "resuming from" in text
    assert second["order"][:3] == first["order"] and second["order"][3:] == ["plain6.delay", "plain6.base.delay"]
    runs = json.loads(subprocess.run([sys.executable, "-m", "sparkit", "status", "--all", "--json"], capture_output=True,
                                     text=True, env=env, timeout=60).stdout or "[]")
    live = [r for r in (runs if isinstance(runs, list) else runs.get("runs", [])) if r.get("state") in ("running", "starting")]
    assert live == []  # every server stopped
