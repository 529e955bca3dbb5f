"""Issue 40, item 3: a recipe's `server.env` is checked against an allowlist, the variables its
engine reads as settings (SGLang's registry, PyTorch, CUDA, NCCL, Triton, ...). The attack as
reported: `server.env: {OPENSSL_CONF: ...}` naming a provider module ran the attacker's code inside
the engine with `plan` silent; CUDA_INJECTION64_PATH, PATH, HOME, HF_HOME, TMPDIR, TRITON_HOME and
XDG_CACHE_HOME passed too. Each is now refused (file, line, key) unless `server.allow_code_env`
names it, and then shown by `plan` (and `up`'s preflight)."""

from __future__ import annotations

import json

import pytest

from sparkit.checks.preflight import check_code_env
from sparkit.cli.main import main
from sparkit.contract.checks import Status
from sparkit.engines.base import engine_environment
from sparkit.engines.sglang import adapter as sglang_adapter
from sparkit.errors import RecipeError
from sparkit.host import detect_host
from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import load_recipe

# What the issue found accepted, and their kin: none is a setting of either engine.
OUTSIDE = ["OPENSSL_CONF", "CUDA_INJECTION64_PATH", "PATH", "HOME", "HF_HOME", "TMPDIR", "TRITON_HOME",
           "XDG_CACHE_HOME", "LD_PRELOAD", "LD_BIND_NOW", "PYTHONPATH", "PYTHONSAFEPATH", "DYLD_INSERT_LIBRARIES",
           "NCCL_NET_PLUGIN", "TRITON_CACHE_MANAGER", "PYTORCH_KERNEL_CACHE_PATH", "TORCH_EXTENSIONS_DIR", "CC",
           "GLIBC_TUNABLES", "LANG", "MY_LIBRARY_SWITCH"]
# Settings of the engine (SGLang's recipe): no opt-in, nothing shown.
SETTINGS = ["SGLANG_ENABLE_METADATA_GLUE_GRAPH", "NCCL_DEBUG", "NCCL_NVLS_ENABLE", "CUDA_VISIBLE_DEVICES",
            "CUDA_LAUNCH_BLOCKING", "PYTORCH_CUDA_ALLOC_CONF", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS",
            "TRITON_PRINT_AUTOTUNING", "FLASHINFER_LOGLEVEL", "HUMMING_COMPILER", "HF_HUB_OFFLINE",
            "SPARKIT_FP8_TUNE", "MOONCAKE_PROTOCOL"]


@pytest.mark.parametrize("recipe", ["tiny", "tiny-sglang"])
@pytest.mark.parametrize("name", OUTSIDE)
def test_a_variable_outside_the_engines_settings_needs_the_recipes_opt_in(tmp_path, name, recipe):
    path = tmp_path / "r.yaml"
    path.write_text(f"extends: {recipe}\nserver:\n  env:\n    {name}: /tmp/attacker\n")
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe(path))
    assert info.value.file == str(path) and info.value.line == 4 and info.value.key == f"server.env.{name}"
    assert "[code-env-needs-opt-in:" in str(info.value) and "server.allow_code_env" in info.value.hint
    path.write_text(f"extends: {recipe}\nserver:\n  allow_code_env: [{name}]\n  env:\n    {name}: /tmp/attacker\n")
    plan = compile_plan(load_recipe(path))
    assert plan.env[name] == "/tmp/attacker" and name in plan.code_env and plan.code_env[name]
    assert any(w.startswith(f"server.env.{name}=/tmp/attacker is outside the engine's settings") for w in plan.warnings)


@pytest.mark.parametrize("name", SETTINGS)
def test_the_engines_own_settings_pass_as_plain_settings(name):
    plan = compile_plan(load_recipe("tiny-sglang", [f"server.env.{name}=1"]))
    assert plan.env[name] == "1" and plan.code_env == {}
    assert not any("allow_code_env" in w for w in plan.warnings)


def test_each_engine_declares_its_own_environment():
    """The embedded engine is PyTorch under sparkit's switches: NCCL and SGLang settings are not its own."""
    for name in ("NCCL_DEBUG", "SGLANG_ENABLE_METADATA_GLUE_GRAPH", "FLASHINFER_LOGLEVEL"):
        assert engine_environment("embedded").needs_opt_in(name)
        assert engine_environment("sglang").needs_opt_in(name) is None
        with pytest.raises(RecipeError, match="code-env-needs-opt-in"):
            compile_plan(load_recipe("tiny", [f"server.env.{name}=1"]))
    assert engine_environment("embedded").needs_opt_in("OMP_NUM_THREADS") is None


def test_the_plan_shows_what_the_recipe_lets_in_beside_the_variable_and_in_json(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text("extends: tiny\nserver:\n  allow_code_env: [OPENSSL_CONF]\n  env:\n    OPENSSL_CONF: /tmp/o.cnf\n")
    with pytest.raises(SystemExit) as info:
        main(["plan", str(path)])
    captured = capsys.readouterr()
    assert info.value.code == 0
    assert "OPENSSL_CONF=/tmp/o.cnf   # outside the engine's settings, allowed by server.allow_code_env" in captured.out
    assert "server.env.OPENSSL_CONF=/tmp/o.cnf is outside the engine's settings (OpenSSL reads" in " ".join(captured.err.split())
    with pytest.raises(SystemExit) as info:
        main(["plan", str(path), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert info.value.code == 0 and list(doc["code_env"]) == ["OPENSSL_CONF"]
    path.write_text("extends: tiny\nserver:\n  env:\n    OPENSSL_CONF: /tmp/o.cnf\n")
    with pytest.raises(SystemExit) as info:  # without the opt-in: exit 3 naming file, line and key
        main(["plan", str(path)])
    assert info.value.code == 3
    assert f"{path}:4:" in capsys.readouterr().err.replace("\n", "")


def test_up_s_preflight_says_what_the_recipe_lets_in():
    allowed = compile_plan(load_recipe("tiny", ["server.env.OPENSSL_CONF=/tmp/o.cnf", "server.allow_code_env=[OPENSSL_CONF]"]))
    result = check_code_env(allowed, detect_host())
    assert result.status is Status.WARN and "OPENSSL_CONF" in result.detail
    assert result.evidence == [f"OPENSSL_CONF=/tmp/o.cnf: {allowed.code_env['OPENSSL_CONF']}"]
    assert result.to_dict()["data"] == {"code_env": allowed.code_env}  # what `up --json` carries
    plain = check_code_env(compile_plan(load_recipe("tiny", ["server.env.OMP_NUM_THREADS=1"])), detect_host())
    assert plain.status is Status.PASS and "1 variable(s), all of them the engine's settings" in plain.detail


def test_many_refused_variables_are_one_error_naming_the_first_and_counting_the_rest():
    env = "{" + ", ".join(f"K{i}: v" for i in range(300)) + "}"
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe("tiny", [f"server.env={env}"]))
    assert info.value.key == "server.env.K0" and "(and 299 more outside the engine's settings: K1, K2, K3, K4, K5, ...)" in str(info.value)


@pytest.mark.parametrize("bad", ["{'A=B': '1'}", "{'1X': '1'}", "{'': '1'}", "{'X': \"a\\0b\"}"])
def test_a_variable_no_environment_can_hold_is_a_located_error(bad):
    """`A=B` used to reach Popen, whose ValueError was an internal error at launch."""
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe("tiny", [f"server.env={bad}", "server.allow_code_env=[A_B]"]))
    assert "[env-names:" in str(info.value) and info.value.key.startswith("server.env")


def test_allow_code_env_names_variables():
    with pytest.raises(RecipeError, match="is not an environment variable name"):
        load_recipe("tiny", ["server.allow_code_env=['LD PRELOAD']"])
    assert load_recipe("tiny", ["server.allow_code_env=[HOME]"]).recipe.server.allow_code_env == ["HOME"]


def test_the_static_sglang_list_is_the_installed_registrys():
    """Where sglang does not import, 0.5.23's registry as sparkit keeps it decides; here it imports
    (or its answers are remembered), and the kept list must be what it says."""
    if sglang_adapter.parser_unavailable() is not None or sglang_adapter.installed_version() != "0.5.23":
        pytest.skip("needs sglang 0.5.23's registry")
    registry = sglang_adapter.env_registry()
    assert {n for n in registry if not n.startswith("SGLANG_")} == sglang_adapter.REGISTRY_OTHER_NAMES
    assert set(sglang_adapter.SGLANG_CODE_ENV) <= registry  # each one still a setting SGLang reads
    static = sglang_adapter.SGLangAdapter.static_environment()
    assert all(static.needs_opt_in(n) == engine_environment("sglang").needs_opt_in(n) for n in registry)
