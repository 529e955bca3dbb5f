"""--help tidying works with the typer releases users have, not only the newest one."""

from __future__ import annotations

import types

from sparkit.cli.main import tidy_help


def _option(name, type_name, **extra):
    param = types.SimpleNamespace(param_type_name="option", metavar=None, is_flag=False, count=False,
                                  opts=[name], type=types.SimpleNamespace(name=type_name), **extra)
    return param


def test_options_get_value_words_without_typer_bare_type():
    """Older typer options have no bare_type(): click's type name must still give the metavar
    (a typer without it once made every sparkit command fail with an internal error)."""
    count = _option("--num-questions", "integer")
    path = _option("--out", "path")
    newer = _option("--limit", "integer", bare_type=lambda: "int")
    command = types.SimpleNamespace(params=[count, path, newer], get_help_option=lambda ctx: None, commands={})
    tidy_help(command)
    assert (count.metavar, newer.metavar) == ("N", "N")
    assert path.metavar in ("PATH", "DIR", "FILE")
