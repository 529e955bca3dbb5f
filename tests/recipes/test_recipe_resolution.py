"""Issue 29 (items 2 and 7) and issue 30's `tiny/tiny`: where a recipe name leads, what a recipe
may put in the engine's environment, and the recipe inputs that used to end in an internal error.
Each attack is performed as it was reported; each outcome is a plan or a located error."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from sparkit.cli.main import main
from sparkit.errors import RecipeError, UsageError
from sparkit.paths import repo_recipes_dir
from sparkit.planning.compile import compile_plan
from sparkit.recipes import load as recipe_load
from sparkit.recipes.load import load_recipe, shipped_recipes

PLANTED = "engine: embedded\nmodel: {path: 'sparkit:tiny-ling'}\nserver:\n  env: {PYTHONPATH: %s}\n"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("planted", ["tiny", "tiny.yaml"])
def test_a_file_in_the_working_directory_does_not_replace_a_shipped_base(tmp_path, monkeypatch, planted):
    """The attack: a file named `tiny` in the working directory became the base of every recipe
    saying `extends: tiny`, its PYTHONPATH with it. Now `tiny` is the shipped recipe, and the
    planted file gets a warning naming it."""
    work = tmp_path / "work"
    work.mkdir()
    (work / planted).write_text(PLANTED % (tmp_path / "evil"))
    (work / "mine.yaml").write_text("extends: tiny\nserver: {port: 30123}\n")
    monkeypatch.chdir(work)
    loaded = load_recipe("mine.yaml")
    plan = compile_plan(loaded)
    assert "PYTHONPATH" not in plan.env
    assert loaded.chain[1] == repo_recipes_dir() / "tiny" / "tiny.yaml"
    (warning,) = [w for w in plan.warnings if "is not used" in w]
    assert warning.startswith("mine.yaml:1 extends: 'tiny' is the shipped recipe") and planted in warning
    assert f"`extends: ./{planted}`" in warning


def test_a_file_named_as_a_path_is_that_file_relative_to_the_recipe(tmp_path, monkeypatch):
    (tmp_path / "tiny").write_text("extends: tiny\nserver: {port: 31001}\n")
    (tmp_path / "mine.yaml").write_text("extends: ./tiny\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # relative to the recipe, not to the working directory
    loaded = load_recipe(tmp_path / "mine.yaml")
    assert loaded.recipe.server.port == 31001 and loaded.chain[1] == tmp_path / "tiny"
    assert not [w for w in compile_plan(loaded).warnings if "is not used" in w]


def test_a_yaml_name_is_beside_the_recipe_never_in_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "base.yaml").write_text("extends: tiny\nserver: {port: 31002}\n")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "mine.yaml").write_text("extends: base.yaml\n")
    monkeypatch.chdir(tmp_path)  # base.yaml is here, not beside sub/mine.yaml
    with pytest.raises(RecipeError) as info:
        load_recipe(sub / "mine.yaml")
    assert info.value.key == "extends" and "extends 'base.yaml' not found" in str(info.value)
    assert "relative to the recipe's own directory" in info.value.hint


def test_a_missing_yaml_base_named_like_a_shipped_recipe_says_how_to_name_it(tmp_path):
    (tmp_path / "mine.yaml").write_text("extends: tiny.yaml\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "mine.yaml")
    assert info.value.hint == "the shipped recipe is named without a path or suffix: `tiny`"


def test_shipped_recipes_extend_their_siblings_from_anywhere(tmp_path, monkeypatch):
    """recipes/tiny/*.yaml say `extends: tiny.yaml` (and tiny-sglang.yaml, spark-baseline.yaml...):
    from a directory holding decoys of the same names they still load their siblings."""
    for name in ("tiny.yaml", "tiny-sglang.yaml", "spark-baseline.yaml", "tp4-baseline.yaml"):
        (tmp_path / name).write_text("this: is not a recipe\n")
    monkeypatch.chdir(tmp_path)
    for name, _path in shipped_recipes():
        loaded = load_recipe(name)
        assert all(repo_recipes_dir() in p.parents for p in loaded.chain), (name, loaded.chain)


def test_tiny_slash_tiny_is_the_default_recipe(capsys):
    """Issue 30: `sparkit plan tiny/tiny` was exit 3, "did you mean 'tiny/tiny-sglang'"."""
    assert load_recipe("tiny/tiny").chain[0] == repo_recipes_dir() / "tiny" / "tiny.yaml"
    with pytest.raises(SystemExit) as info:
        main(["plan", "tiny/tiny", "--json"])
    assert info.value.code == 0, capsys.readouterr().err


def test_a_local_file_with_a_shipped_name_on_the_command_line_is_a_warning(tmp_path, monkeypatch):
    (tmp_path / "tiny").write_text(PLANTED % tmp_path)
    monkeypatch.chdir(tmp_path)
    plan = compile_plan(load_recipe("tiny"))
    assert "PYTHONPATH" not in plan.env
    assert any("the file tiny in the current directory has the same name and is not used" in w for w in plan.warnings)
    assert "PYTHONPATH" in compile_plan(load_recipe("./tiny", ["server.allow_code_env=[PYTHONPATH]"])).env


def test_a_name_no_shipped_recipe_has_may_be_a_local_file_on_the_command_line(tmp_path, monkeypatch):
    (tmp_path / "myrecipe").write_text("extends: tiny\nserver: {port: 31003}\n")
    monkeypatch.chdir(tmp_path)
    assert load_recipe("myrecipe").recipe.server.port == 31003
    (tmp_path / "mine.yaml").write_text("extends: myrecipe\n")  # in extends, a file is named as a path
    with pytest.raises(RecipeError) as info:
        load_recipe("mine.yaml")
    assert info.value.hint == "a file is named as a path: `extends: ./myrecipe`"


# -- code loaded into the engine (more in test_engine_environment.py) ---------------------------------


def test_pythonpath_exported_in_the_shell_still_reaches_the_engine(monkeypatch):
    """The SGLang H200 kit exports PYTHONPATH in the shell: that is the user's, not the recipe's."""
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    plan = compile_plan(load_recipe("tiny-sglang"))
    assert "PYTHONPATH" not in plan.env  # nothing refused, and launch passes os.environ through


# -- inputs that were internal errors ------------------------------------------------------------------


def test_a_990_file_extends_chain_is_a_located_error_in_bounded_time(tmp_path):
    (tmp_path / "r0.yaml").write_text("extends: tiny\n")
    for i in range(1, 990):
        (tmp_path / f"r{i}.yaml").write_text(f"extends: r{i - 1}.yaml\n")
    start = cpu_seconds()
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "r989.yaml")
    assert cpu_seconds() - start < 2
    assert info.value.key == "extends" and f"longer than {recipe_load.MAX_EXTENDS_DEPTH} recipes" in str(info.value)
    assert load_recipe(tmp_path / f"r{recipe_load.MAX_EXTENDS_DEPTH - 2}.yaml").recipe.engine == "embedded"  # 31 + tiny


# libyaml refuses a surrogate escape itself; the pure-Python parser builds the string, and the
# loader names it.
SURROGATE = r"(lone UTF-16 surrogate \\ud[89abcdef]|invalid Unicode character escape)"


@pytest.mark.parametrize(("assignment", "text"), [
    ("server.memory_guard.floor_gib=1e309", "input should be a finite number"),
    ("server.memory_guard.floor_gib=1e300", "input should be less than or equal to"),
    ('model.path="\\ud800"', SURROGATE),
    ('server.env={"X": "\\udfff"}', SURROGATE),
    ("model.context_length=" + "9" * 400, "input should be less than or equal to"),
])
def test_set_values_that_crashed_are_named(capsys, assignment, text):
    import re

    with pytest.raises(SystemExit) as info:
        main(["plan", "tiny", "--set", assignment])
    err = capsys.readouterr().err
    assert info.value.code in (2, 3) and re.search(text, " ".join(err.split())) and "--set" in err, err
    assert "internal error" not in err and "Traceback" not in err


def test_up_with_an_infinite_floor_is_a_recipe_error_before_anything_starts(sparkit_home):
    up = subprocess.run([sys.executable, "-m", "sparkit", "up", "tiny", "--set", "server.memory_guard.floor_gib=1e309",
                         "--detach"], capture_output=True, text=True, timeout=120,
                        env={**os.environ, "SPARKIT_HOME": str(sparkit_home)})
    assert up.returncode == 3 and "--set server.memory_guard.floor_gib: input should be a finite number" in up.stderr
    assert not (sparkit_home / "runs").exists() or not list((sparkit_home / "runs").iterdir())


@pytest.mark.parametrize("text", ["description: \"\\ud800\"\n", "\"\\udc00\": 1\n", "checks: {min_decode_tok_s: 1e309}\n",
                                  "checks: {min_decode_tok_s: .nan}\n", "checks: {min_decode_tok_s: -.inf}\n"])
def test_lone_surrogates_and_infinities_in_a_file_are_located(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text("extends: tiny\n" + text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert info.value.file.endswith("r.yaml") and info.value.line == 2
    assert any(m in str(info.value) for m in ("unreadable value", "invalid Unicode character escape", "a finite number"))


@pytest.mark.parametrize("text", ['description: "\\ud800"\n', "checks: {min_decode_tok_s: 1.0e+309}\n"])
def test_the_pure_python_parser_is_checked_the_same_way(tmp_path, monkeypatch, text):
    """Without libyaml, PyYAML builds the lone surrogate: the loader itself refuses it."""
    import yaml

    monkeypatch.delattr(yaml, "CSafeLoader")
    path = tmp_path / "r.yaml"
    path.write_text("extends: tiny\n" + text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert info.value.line == 2 and "unreadable value" in str(info.value)


def test_a_name_over_name_max_is_a_recipe_error_naming_it(tmp_path, capsys):
    long = "a" * 300 + ".yaml"
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / long)
    assert "File name too long" in str(info.value) and "NAME_MAX" in info.value.hint
    (tmp_path / "mine.yaml").write_text(f"extends: {long}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "mine.yaml")
    assert info.value.key == "extends" and "File name too long" in str(info.value)
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", long])
    err = capsys.readouterr().err
    assert exit_info.value.code == 3 and "--out" not in err and "NAME_MAX" in err


@pytest.mark.slow
def test_a_recipe_piped_to_plan_is_read_from_standard_input(tmp_path):
    """`... | sparkit plan /dev/stdin` was a `/proc/.../pipe:[...]` error: now it plans (and
    `-` means the same); a terminal on standard input is named as such."""
    for ref in ("/dev/stdin", "-"):
        proc = subprocess.run([sys.executable, "-m", "sparkit", "plan", ref, "--json"], input="extends: tiny\nserver: {port: 31004}\n",
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert '"port": 31004' in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "sparkit", "plan", "-"], input="server: {port: x}\n",
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and "<stdin>:1:" in proc.stderr


def test_the_quadratic_merge_is_linear(tmp_path):
    """8000 + 8000 server.env keys through extends took 38.5 s of CPU to plan."""
    # (sparkit's own switches: names the engine's allowlist takes, so that the whole plan is compiled)
    (tmp_path / "base.yaml").write_text("extends: tiny\nserver:\n  env:\n" + "".join(f"    SPARKIT_K{i}: v\n" for i in range(8000)))
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nserver:\n  env:\n" + "".join(f"    SPARKIT_J{i}: v\n" for i in range(8000)))
    start = cpu_seconds()
    plan = compile_plan(load_recipe(tmp_path / "child.yaml"))
    assert cpu_seconds() - start < 2
    assert len([k for k in plan.env if k[8] in "JK"]) == 16000
    loaded = load_recipe(tmp_path / "child.yaml")
    assert loaded.origin("server", "env", "SPARKIT_K7999").file.endswith("base.yaml")
    assert loaded.origin("server", "env", "SPARKIT_J7999").file.endswith("child.yaml")


def test_a_20000_item_extra_args_error_is_short_and_quick(tmp_path, capsys):
    path = tmp_path / "x.yaml"
    path.write_text("extends: tiny\nserver:\n  extra_args: [" + ",".join(f"--b{i}" for i in range(20000)) + "]\n")
    start = cpu_seconds()
    with pytest.raises(SystemExit) as info:
        main(["plan", str(path)])
    assert cpu_seconds() - start < 2
    err = capsys.readouterr().err
    assert info.value.code == 3 and "server.extra_args: list should have at most 512 items" in err
    assert "(20000 items)" in err and len(err) < 600


def test_a_set_error_keeps_a_bad_key_out_of_sections_it_lacks():
    with pytest.raises(UsageError):
        load_recipe("tiny", ["stack.lm_haed=fp8"])
