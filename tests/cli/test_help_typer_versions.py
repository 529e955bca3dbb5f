"""--help's words for option values work with the typer releases users have, not only the newest one."""

from __future__ import annotations

import types

from sparkit.cli.command_tree import option_metavar


def _option(name, type_name, **extra):
    fields = {"param_type_name": "option", "metavar": None, "is_flag": False, "count": False, "opts": [name],
              "type": types.SimpleNamespace(name=type_name), **extra}
    return types.SimpleNamespace(**fields)


def test_options_get_value_words_without_typer_bare_type():
    """Older typer options have no bare_type(): click's type name must still give the metavar
    (a typer without it once made every sparkit command fail with an internal error)."""
    count = _option("--num-questions", "integer")
    path = _option("--out", "path")
    newer = _option("--limit", "integer", bare_type=lambda: "int")
    assert (option_metavar(count), option_metavar(newer)) == ("N", "N")
    assert option_metavar(path) == "PATH"
    assert option_metavar(_option("--greedy", "boolean", is_flag=True)) == ""
