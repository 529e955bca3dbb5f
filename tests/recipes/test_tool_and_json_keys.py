"""server.tool_call_parser and server.constrained_json: one recipe key each, the same SGLang flag on
both engines (their settings tables), asserted in the resolved args when set; the Ling recipes
turn SGLang's ling3 parser on, the default recipe compact JSON and ling3, and SGLang's defaults stay
one --set away."""

from __future__ import annotations

import pytest

from sparkit import compile_plan, load_recipe
from sparkit.engines.embedded.adapter import embedded_arg_parser

LING = ["ling-3.0-flash/spark-baseline", "ling-3.0-flash/spark-humming", "ling-3.0-flash/spark-humming-fp8head",
        "ling-3.0-flash/spark-optimized", "ling-3.0-flash/tp4-baseline", "ling-3.0-flash/tp4-nextn",
        "ling-3.0-flash/tp4-nextn-h200", "ling-3.0-flash/tp4-dspark"]


def _after(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


@pytest.mark.parametrize("name", LING)
def test_every_ling_recipe_runs_sglangs_ling3_parser(name):
    plan = compile_plan(load_recipe(name))
    assert _after(plan.argv, "--tool-call-parser") == "ling3"
    assert plan.expectations.server_args["tool_call_parser"] == "ling3"


def test_the_default_recipe_writes_compact_json_and_parses_ling3_and_sglangs_defaults_are_one_set_away():
    plan = compile_plan(load_recipe("tiny"))
    assert "--constrained-json-disable-any-whitespace" in plan.argv and _after(plan.argv, "--tool-call-parser") == "ling3"
    assert plan.expectations.server_args["constrained_json_disable_any_whitespace"] is True
    args = embedded_arg_parser().parse_args(plan.argv[plan.argv.index("sparkit.engines.embedded") + 1:])
    assert args.constrained_json_disable_any_whitespace and args.tool_call_parser == "ling3"
    stock = compile_plan(load_recipe("tiny", ["server.constrained_json.disable_any_whitespace=false",
                                              "server.tool_call_parser=null"]))
    assert "--constrained-json-disable-any-whitespace" not in stock.argv and "--tool-call-parser" not in stock.argv
    assert "constrained_json_disable_any_whitespace" not in stock.expectations.server_args


@pytest.mark.parametrize("name", ["tiny", "tiny/tiny-sglang"])
def test_a_whitespace_bound_reaches_either_engine(name):
    plan = compile_plan(load_recipe(name, ["server.constrained_json.max_whitespace_cnt=2"]))
    assert _after(plan.argv, "--constrained-json-max-whitespace-cnt") == "2"
    assert plan.expectations.server_args["constrained_json_max_whitespace_cnt"] == 2


def test_a_pass_through_of_a_managed_flag_names_the_key():
    from sparkit.errors import RecipeError

    with pytest.raises(RecipeError, match="server.tool_call_parser"):
        compile_plan(load_recipe("tiny/tiny-sglang", ["server.extra_args=[--tool-call-parser, ling3]"]))
