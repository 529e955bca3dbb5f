"""Loading recipes: every error class names file:line:col and the key path."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sparkit.errors import RecipeError, UsageError
from sparkit.recipes.load import DEFAULT_RECIPE, load_recipe, shipped_recipes


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = (tmp_path / name).resolve()
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


BASE = """
engine: sglang
model:
  path: org/model
stack:
  lm_head: bf16
  tp: 1
"""


def test_every_shipped_recipe_loads_and_default_is_tiny():
    names = [n for n, _ in shipped_recipes()]
    assert {"tiny", "tiny/tiny-baseline", "tiny/tiny-wrong-draft", "tiny/tiny-unshared-head",
            "ling-3.0-flash/spark-baseline", "ling-3.0-flash/spark-humming", "ling-3.0-flash/spark-humming-fp8head",
            "ling-3.0-flash/spark-optimized", "ling-3.0-flash/tp4-baseline", "ling-3.0-flash/tp4-nextn",
            "ling-3.0-flash/tp4-dspark"} <= set(names)
    for name in names:
        assert load_recipe(name).name == name
    default = load_recipe(DEFAULT_RECIPE)
    assert default.recipe.engine == "embedded" and default.recipe.model.path == "sparkit:tiny-ling"
    # A unique file stem is enough for a shipped recipe.
    assert load_recipe("tiny-baseline").name == "tiny/tiny-baseline"


def test_shipped_recipes_open_with_published_figure_comment():
    for name, path in shipped_recipes():
        first = path.read_text().splitlines()[0]
        assert first.startswith("# "), name
        if name.startswith("ling-3.0-flash/"):
            head = "\n".join(path.read_text().splitlines()[:6])
            assert "Published:" in head and ("NVIDIA" in head or "LMSYS" in head), name


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = write(tmp_path, "bad.yaml", """
    model:
      path: org/model
    stack: [fp8
    """)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:") and "YAML syntax error" in msg
    assert info.value.line is not None and info.value.line >= 3


def test_unknown_key_has_did_you_mean(tmp_path):
    path = write(tmp_path, "typo.yaml", BASE + "  lm_haed: fp8\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).startswith(f"{path}:7:12 stack.lm_haed: unknown key 'lm_haed'; did you mean 'lm_head'?")
    assert "lm_head" in info.value.hint


def test_bad_enum_lists_allowed_values(tmp_path):
    path = write(tmp_path, "enum.yaml", BASE.replace("lm_head: bf16", "lm_head: fp16"))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value) == f"{path}:5:12 stack.lm_head: 'fp16' is not one of bf16, fp32, fp8"


def test_wrong_type(tmp_path):
    path = write(tmp_path, "type.yaml", BASE.replace("tp: 1", "tp: four"))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:6:7 stack.tp: ") and "integer" in msg and "'four'" in msg


def test_negative_exact_top_k_names_the_key(tmp_path):
    path = write(tmp_path, "exact.yaml", BASE.replace("lm_head: bf16", "lm_head: fp8\n  lm_head_exact_top_k: -1"))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:6:24 stack.lm_head_exact_top_k: ") and "0" in msg


def test_missing_model_is_required(tmp_path):
    path = write(tmp_path, "nomodel.yaml", "engine: sglang\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert "model: is required" in str(info.value) and str(info.value).startswith(str(path))


def test_duplicate_key(tmp_path):
    path = write(tmp_path, "dup.yaml", BASE + "  tp: 2\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).startswith(f"{path}:7:3 stack.tp: duplicate key")


def test_extends_deep_merges_and_child_wins(tmp_path):
    write(tmp_path, "base.yaml", BASE + "server:\n  port: 31000\n  mem_fraction_static: 0.5\n")
    child = write(tmp_path, "child.yaml", """
    extends: base.yaml
    stack:
      lm_head: fp8
    server:
      port: 32000
    """)
    loaded = load_recipe(child)
    r = loaded.recipe
    assert (r.stack.lm_head, r.stack.tp, r.server.port, r.server.mem_fraction_static) == ("fp8", 1, 32000, 0.5)
    assert [p.name for p in loaded.chain] == ["child.yaml", "base.yaml"]
    # Errors in inherited keys point at the base file.
    write(tmp_path, "base2.yaml", BASE.replace("tp: 1", "tp: zero"))
    child2 = write(tmp_path, "child2.yaml", "extends: base2.yaml\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(child2)
    assert str(info.value).startswith(f"{tmp_path.resolve() / 'base2.yaml'}:6:7 stack.tp")


def test_extends_a_shipped_name(tmp_path):
    path = write(tmp_path, "mine.yaml", "extends: ling-3.0-flash/spark-optimized\nserver:\n  port: 30123\n")
    r = load_recipe(path).recipe
    assert r.stack.moe_backend == "humming" and r.stack.speculative.num_steps == 3 and r.server.port == 30123


def test_switching_speculative_method_replaces_the_section(tmp_path):
    r = load_recipe("ling-3.0-flash/tp4-dspark").recipe
    assert r.stack.speculative.method == "dspark"
    assert r.stack.speculative.num_steps is None and r.stack.speculative.num_draft_tokens is None


def test_missing_extends_names_the_chain(tmp_path):
    write(tmp_path, "a.yaml", "extends: b.yaml\n" + BASE)
    write(tmp_path, "b.yaml", "extends: nowhere.yaml\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "a.yaml")
    msg = str(info.value)
    assert msg.startswith(f"{tmp_path.resolve() / 'b.yaml'}:1:10 extends: extends 'nowhere.yaml' not found")
    assert "a.yaml -> " in msg and "b.yaml -> nowhere.yaml" in msg


def test_cyclic_extends_names_the_cycle(tmp_path):
    write(tmp_path, "a.yaml", "extends: b.yaml\n" + BASE)
    write(tmp_path, "b.yaml", "extends: a.yaml\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "a.yaml")
    msg = str(info.value)
    assert "cyclic extends:" in msg and msg.count("a.yaml") >= 2 and "b.yaml" in msg


def test_unknown_recipe_name_suggests(tmp_path):
    with pytest.raises(RecipeError) as info:
        load_recipe("ling-3.0-flash/spark-optimised")
    assert "no recipe file or shipped recipe named" in str(info.value)
    assert info.value.hint == "did you mean 'ling-3.0-flash/spark-optimized'?"


def test_set_overrides_are_yaml_typed_and_win(tmp_path):
    write(tmp_path, "base.yaml", BASE + "server:\n  port: 31000\n")
    child = write(tmp_path, "child.yaml", "extends: base.yaml\nserver:\n  port: 32000\n")
    r = load_recipe(child, ["server.port=33000", "server.mem_fraction_static=0.68", "stack.speculative=nextn",
                            "server.extra_args=[--disable-radix-cache]"]).recipe
    assert r.server.port == 33000 and r.server.mem_fraction_static == 0.68
    assert r.stack.speculative.method == "nextn" and r.server.extra_args == ["--disable-radix-cache"]
    r = load_recipe("tiny", ["stack.speculative.num_steps=2", "stack.speculative.num_draft_tokens=3"]).recipe
    assert (r.stack.speculative.num_steps, r.stack.speculative.num_draft_tokens) == (2, 3)


@pytest.mark.parametrize(
    ("assignment", "error", "text"),
    [
        ("stack.lm_head", UsageError, "expected KEY.PATH=VALUE"),
        ("=fp8", UsageError, "empty key path"),
        ("stack.lm_head=[fp8", UsageError, "not valid YAML"),
        ("model.path.x=1", UsageError, "'model.path' is a value, not a section"),
        ("stack.lm_haed=fp8", UsageError, "--set stack.lm_haed: unknown key 'lm_haed'; did you mean 'lm_head'?"),
        ("stack.nonexistent=1", UsageError, "--set stack.nonexistent: unknown key 'nonexistent'"),
        ("nonexistent.x=1", UsageError, "--set nonexistent.x: unknown key 'nonexistent'"),
        ("extends=tiny", UsageError, "--set extends: "),
        ("stack.lm_head=fp16", RecipeError, "--set stack.lm_head: 'fp16' is not one of bf16, fp32, fp8"),
        ("server.port=high", RecipeError, "--set server.port: "),
    ],
)
def test_set_errors(assignment, error, text):
    with pytest.raises(error) as info:
        load_recipe("tiny", [assignment])
    assert text in str(info.value)


def test_api_key_env_must_name_a_variable(tmp_path):
    path = write(tmp_path, "key.yaml", BASE + "server:\n  api_key_env: sk-123/abc\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert "server.api_key_env" in str(info.value) and "not an environment variable name" in str(info.value)
    assert load_recipe(path, ["server.api_key_env=MY_KEY"]).recipe.server.api_key_env == "MY_KEY"
