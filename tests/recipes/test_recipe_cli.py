"""`sparkit plan`, `recipes list|show|validate`, `doctor` through the CLI runner; exit codes
and import hygiene through real subprocesses."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from sparkit.cli.main import app
from sparkit.errors import RecipeError

runner = CliRunner()


@pytest.mark.slow
def test_plan_prints_the_exact_command_env_provisions_and_expectations():
    result = runner.invoke(app, ["plan", "ling-3.0-flash/spark-optimized"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "SGLANG_PLUGINS=sparkit SPARKIT_FP8_LM_HEAD_EXACT_TOP_K=4 SPARKIT_SGLANG_PLUGIN=1 " in out
    assert "-m sglang.launch_server --model-path inclusionAI/Ling-3.0-flash-fp4" in out
    assert "--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 " \
           "--speculative-num-draft-tokens 4" in out
    assert "sparkit-plugin" in out and "server_args.speculative_algorithm: EAGLE" in out
    assert "draft_shares_lm_head: True" in out
    from _shared import REPO_DIR

    by_path = runner.invoke(app, ["plan", str(REPO_DIR / "recipes" / "ling-3.0-flash" / "spark-optimized.yaml")])
    assert by_path.exit_code == 0 and by_path.output == out


def test_plan_json_with_set_and_port():
    result = runner.invoke(app, ["plan", "tiny", "--set", "stack.lm_head=bf16", "--port", "30999", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["engine"] == "embedded" and plan["port"] == 30999
    assert plan["argv"][plan["argv"].index("--lm-head-dtype") + 1] == "bf16"
    assert plan["expectations"]["draft_shares_lm_head"] is None
    assert plan["model_builds"][0]["name"] == "tiny-ling"


@pytest.mark.slow
def test_plan_shows_the_memory_fit_computed_from_the_checkpoint_headers(tmp_path, monkeypatch):
    import importlib.util

    from _shared import REPO_DIR

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    unread = runner.invoke(app, ["plan", "ling-3.0-flash/spark-optimized"])
    assert unread.exit_code == 0, unread.output
    # Offline and not here: the declared profile's fit, said so (the hub's headers: tests/hub/test_pull_fit.py).
    assert "checkpoint: sparkit's declared profile of Ling-3.0-flash-fp4" in " ".join(unread.output.split())
    unknown = runner.invoke(app, ["plan", "ling-3.0-flash/spark-optimized", "--set", "model.path=someorg/unprofiled"])
    assert "memory fit: cannot read the checkpoint someorg/unprofiled" in unknown.output
    assert "needs: `sparkit pull someorg/unprofiled`" in " ".join(unknown.output.split())
    spec = importlib.util.spec_from_file_location("make_sparse_ling", REPO_DIR / "scripts" / "make_sparse_ling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ling = module.write_checkpoint(tmp_path / "ling", "fp4")
    shown = runner.invoke(app, ["plan", "ling-3.0-flash/spark-optimized", "--set", f"model.path={ling}"])
    assert shown.exit_code == 0, shown.output
    out = shown.output
    assert "memory fit: fits: mem_fraction_static 0.68 is within [" in out
    for line in ("routed experts", "FP8 lm_head copy (sparkit plugin)", "KV cache (7 MLA layers)",
                 "linear-attention state (35 KDA layers)", "OS floor", "mem_fraction_static >= ", "mem_fraction_static <= "):
        assert line in out, line
    # the headline's interval is the arithmetic's, rounded inwards (it said [0.649, 0.813] beside "= 0.814")
    low, high = re.search(r"is within \[([0-9.]+), ([0-9.]+)\]", out).groups()
    raw_low, shown_low = re.search(r"mem_fraction_static >= .* = ([0-9.]+), rounded up: ([0-9.]+)", out).groups()
    raw_high, shown_high = re.search(r"mem_fraction_static <= .* = ([0-9.]+), rounded down: ([0-9.]+)", out).groups()
    assert (shown_low, shown_high) == (low, high)
    assert float(raw_low) <= float(low) and float(high) <= float(raw_high)
    doc = json.loads(runner.invoke(app, ["plan", "ling-3.0-flash/spark-optimized", "--set", f"model.path={ling}",
                                         "--json"]).stdout)
    assert doc["argv"][0] and doc["memory_fit"]["verdict"] == "fits"
    assert doc["memory_fit"]["min_fraction"] < 0.68 < doc["memory_fit"]["max_fraction"]
    assert doc["memory_fit"]["weights_bytes"] == sum(t["bytes"] for t in doc["memory_fit"]["terms"] if t["group"] == "weights")


def test_plan_bad_recipe_raises_recipe_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  path: x/y\nstack:\n  lm_head: fp16\n")
    result = runner.invoke(app, ["plan", str(bad)])
    assert isinstance(result.exception, RecipeError)
    assert "stack.lm_head: 'fp16' is not one of bf16, fp32, fp8" in str(result.exception)


def test_recipes_list_show_validate(tmp_path):
    result = runner.invoke(app, ["recipes", "list", "--json"])
    assert result.exit_code == 0
    names = {r["name"] for r in json.loads(result.stdout)}
    assert "tiny" in names and "ling-3.0-flash/tp4-dspark" in names
    text = runner.invoke(app, ["recipes", "list"]).output
    assert "spark-optimized" in text and "Humming" in text

    shown = runner.invoke(app, ["recipes", "show", "ling-3.0-flash/spark-optimized", "--set", "server.port=31000"])
    assert shown.exit_code == 0
    assert "moe_backend: humming" in shown.output and "port: 31000" in shown.output
    assert "spark-baseline.yaml" in shown.output  # the extends chain
    data = json.loads(runner.invoke(app, ["recipes", "show", "tiny-wrong-draft", "--json"]).stdout)
    assert data["recipe"]["stack"]["speculative"]["draft_model"] == "sparkit:tiny-ling:seed=1:steps=40"
    assert data["recipe"]["stack"]["lm_head"] == "fp8"  # inherited from tiny

    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  path: x/y\nstak:\n  tp: 2\n")
    result = runner.invoke(app, ["recipes", "validate", "tiny", str(bad), "--json"])
    assert result.exit_code == RecipeError.exit_code == 3
    rows = json.loads(result.stdout)
    assert [r["ok"] for r in rows] == [True, False]
    assert "unknown key 'stak'; did you mean 'stack'?" in rows[1]["error"]
    assert runner.invoke(app, ["recipes", "validate", "ling-3.0-flash/tp4-nextn"]).exit_code == 0


@pytest.mark.slow
def test_recipes_show_redirected_is_yaml_that_loads_back_as_the_same_recipe(tmp_path):
    """`sparkit recipes show X > mine.yaml` then `sparkit recipes validate mine.yaml`: the
    output is plain YAML (comments as # lines, no markup, no wrapping at 80 columns)."""
    import yaml

    from sparkit.recipes.load import load_recipe

    names = [r["name"] for r in json.loads(runner.invoke(app, ["recipes", "list", "--json"]).stdout)]
    for name in names:
        shown = runner.invoke(app, ["recipes", "show", name])
        assert shown.exit_code == 0, shown.output
        text = shown.stdout
        assert text.startswith(f"# {load_recipe(name).name}: ") and "\x1b" not in text
        assert isinstance(yaml.safe_load(text), dict), text  # the chain line is a comment
        saved = tmp_path / f"{name.replace('/', '_')}.yaml"
        saved.write_text(text)
        validated = runner.invoke(app, ["recipes", "validate", str(saved)])
        assert validated.exit_code == 0, (name, validated.output)
        original = load_recipe(name).resolved()
        original.pop("extends")
        again = load_recipe(saved).resolved()
        assert again.pop("extends") is None  # fully resolved: nothing left to inherit
        assert again == original, name
    # Overrides are applied and said in a comment.
    shown = runner.invoke(app, ["recipes", "show", "tiny", "--set", "server.port=31001"]).stdout
    assert "# with --set server.port=31001\n" in shown and yaml.safe_load(shown)["server"]["port"] == 31001


def test_doctor_reports_a_host_without_gpu_cleanly():
    result = runner.invoke(app, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["host"]["cpu_cores"] >= 1 and report["host"]["ram_total_bytes"] > 0
    engines = {e["name"]: e for e in report["engines"]}
    assert engines["sglang"]["importable"] and engines["sglang"]["version"] == "0.5.23"
    targets = {(t["target"], t["engine"]): t for t in report["targets"]}
    assert "tiny" in targets["auto", "embedded"]["recipes"] and targets["auto", "embedded"]["ok"]
    assert "tiny/tiny-sglang" in targets["auto", "sglang"]["recipes"]
    if not report["host"]["gpus"]:
        assert not targets["gb10", "sglang"]["ok"] and "needs 1 GPU" in targets["gb10", "sglang"]["why"]
        assert not targets["auto", "sglang"]["ok"]  # SGLang needs a GPU whatever the target
    memory = report["memory"]
    assert 0 < memory["meminfo"]["free"] <= memory["meminfo"]["available"] <= memory["meminfo"]["total"]
    assert memory["unified"] is bool(report["host"]["gpus"] and all(g["unified_memory"] for g in report["host"]["gpus"]))
    assert any("tiny-ling" in c["directory"] for c in memory["checkpoints"])  # the shipped recipes' local checkpoint
    text = runner.invoke(app, ["doctor"]).output
    assert "engines" in text and "sglang" in text
    assert "the OS can give now (MemAvailable)" in text and "NVML" in text


def _run(args: list[str], **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=120, **kw)


def test_exit_code_and_message_for_a_bad_recipe_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  path: x/y\nstack:\n  lm_head: fp16\n")
    proc = _run(["-m", "sparkit", "plan", str(bad)])
    assert proc.returncode == 3
    assert "stack.lm_head: 'fp16' is not one of bf16, fp32, fp8" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    proc = _run(["-m", "sparkit", "plan", "tiny", "--set", "stack.lm_head"])
    assert proc.returncode == 2 and "expected KEY.PATH=VALUE" in proc.stderr


def test_help_imports_no_heavy_modules():
    code = (
        "import sys\n"
        "from sparkit.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'sglang', 'textual', 'scipy', 'huggingface_hub') if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    proc = _run(["-c", code])
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY=\n" in proc.stdout, proc.stdout[-500:]
    assert "plan" in proc.stdout and "doctor" in proc.stdout


def test_plan_of_a_tiny_recipe_imports_no_sglang():
    code = (
        "import sys\n"
        "from sparkit.planning.compile import compile_plan\n"
        "from sparkit.recipes.load import load_recipe\n"
        "compile_plan(load_recipe('tiny'))\n"
        "print('HEAVY=' + ','.join(m for m in ('torch', 'sglang') if m in sys.modules))\n"
    )
    proc = _run(["-c", code])
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY=\n" in proc.stdout


_WITHOUT_SGLANG = """
import sys
class _NoSGLang:
    def find_spec(self, name, path=None, target=None):
        if name == "sglang" or name.startswith("sglang."):
            raise ModuleNotFoundError("No module named 'sglang'", name="sglang")
        return None
sys.meta_path.insert(0, _NoSGLang())
from sparkit.cli.main import main
main(sys.argv[1:])
"""


def _sparkit_without_sglang(*args: str) -> subprocess.CompletedProcess:
    """sparkit in a real process where `import sglang` fails, as after the README's set-up."""
    return subprocess.run([sys.executable, "-c", _WITHOUT_SGLANG, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_plan_without_sglang_prints_the_plan_with_a_note_and_strict_fails_with_exit_4():
    done = _sparkit_without_sglang("plan", "ling-3.0-flash/spark-optimized")
    assert done.returncode == 0, done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    assert "-m sglang.launch_server --model-path inclusionAI/Ling-3.0-flash-fp4" in done.stdout
    assert "SPARKIT_SGLANG_PLUGIN=1" in done.stdout  # stock 0.5.23 has no FP8 head: the plugin provides it
    assert "not validated by SGLang's own argument parser" in " ".join(done.stderr.split())
    assert "pip install --no-deps sglang==0.5.23" in " ".join(done.stderr.split())
    as_json = _sparkit_without_sglang("plan", "ling-3.0-flash/spark-optimized", "--json")
    assert as_json.returncode == 0
    plan = json.loads(as_json.stdout)
    assert plan["validated_by"] is None and "ModuleNotFoundError" in plan["validation_note"]
    strict = _sparkit_without_sglang("plan", "ling-3.0-flash/spark-optimized", "--strict")
    assert strict.returncode == 4 and strict.stdout == ""
    assert "error: not validated by SGLang's own argument parser" in " ".join(strict.stderr.split())
    # a recipe mistake is still caught without the parser
    bad = _sparkit_without_sglang("plan", "ling-3.0-flash/spark-optimized", "--set", "stack.lm_head=fp16")
    assert bad.returncode == 3 and "stack.lm_head" in bad.stderr


@pytest.mark.slow
def test_plan_with_sglang_says_what_validated_it():
    result = runner.invoke(app, ["plan", "ling-3.0-flash/spark-optimized", "--json", "--strict"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["validated_by"].startswith("sglang 0.5.23") and plan["validation_note"] is None
