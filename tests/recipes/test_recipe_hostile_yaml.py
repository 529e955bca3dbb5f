"""Issue 15's recipe attacks, each performed for real: every one is a located RecipeError
(exit 3 through the CLI), never an internal error or an unbounded load."""

from __future__ import annotations

import os

import pytest

from sparkit.cli.main import main
from sparkit.errors import RecipeError
from sparkit.recipes.load import MAX_NESTING, load_recipe

BASE = "engine: embedded\nmodel: {path: 'sparkit:tiny-ling'}\n"

# The 374-byte bomb: 7 levels of 9 (9**7 = 4.8 million leaves if expanded).
BOMB = "a0: &a0 [" + ", ".join(["x"] * 9) + "]\n" + "".join(
    f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 7))


@pytest.mark.parametrize(
    ("text", "message", "line"),
    [
        (BASE + BOMB, "YAML alias '*a0'", 4),
        (BASE + "description: &a [*a]\n", "YAML alias '*a'", 3),
        (BASE + "stack: {<<: {tp: 1}}\n", "YAML merge key '<<'", 3),
        (BASE + "description: " + "[" * 1000 + "]" * 1000 + "\n", f"nested more than {MAX_NESTING} levels", 3),
        (BASE + "description: !!python/object:os.system x\n", "YAML tag 'tag:yaml.org,2002:python/object:os.system'", 3),
        (BASE + "description: ok\x00\n", "character U+0000 is not allowed", 3),
        (BASE + "server: {port: " + "9" * 5000 + "}\n", "a number too long to read", 3),
        (BASE + "? [a, b]\n: c\n", "a key must be a plain name", 3),
    ],
    ids=["alias-bomb", "self-alias", "merge-key", "deep-nesting", "python-tag", "nul", "huge-int", "list-key"],
)
def test_hostile_yaml_is_a_located_error(tmp_path, capsys, text, message, line):
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert message in str(info.value)
    assert info.value.file is not None and info.value.file.endswith("hostile.yaml")
    assert info.value.line == line
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 3 and message in err
    assert "internal error" not in err and "Traceback" not in err


def test_a_date_like_value_is_text_not_a_crash(tmp_path):
    path = tmp_path / "dated.yaml"
    path.write_text(BASE + "description: 2020-13-45\n")
    assert load_recipe(path).recipe.description == "2020-13-45"


@pytest.mark.parametrize("kind", ["directory", "fifo", "device"])
def test_a_path_that_is_not_a_file_is_named_as_such(tmp_path, capsys, kind):
    if kind == "directory":
        target, expected = tmp_path, "it is a directory"
    elif kind == "fifo":
        target, expected = tmp_path / "pipe", "it is a named pipe (FIFO)"
        os.mkfifo(target)  # opening it blocking would hang until a writer came
    else:
        target, expected = "/dev/zero", "it is a character device"
    with pytest.raises(SystemExit) as info:
        main(["plan", str(target)])
    err = capsys.readouterr().err
    assert info.value.code == 3 and expected in err and "no recipe file" not in err


def test_extends_of_a_directory_is_located_at_extends(tmp_path):
    path = tmp_path / "child.yaml"
    path.write_text(f"extends: {tmp_path}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert info.value.key == "extends" and "it is a directory" in str(info.value)


def test_an_oversized_file_is_refused_before_parsing(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(BASE + "description: '" + "x" * (300 * 1024) + "'\n")
    with pytest.raises(RecipeError, match="larger than 256 KiB"):
        load_recipe(path)


def test_a_set_value_with_an_alias_names_set(capsys):
    with pytest.raises(SystemExit) as info:
        main(["plan", "tiny", "--set", "server.env=&a [*a]"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--set server.env: YAML alias" in err
