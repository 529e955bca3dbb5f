"""The `tool calls` startup check: whether the server reads the model's tool calls (SGLang's
--tool-call-parser), judged from /server_info against the recipe's server.tool_call_parser, on a
plan the recipe compiler made (both engines report the parser under SGLang's name)."""

from __future__ import annotations

import pytest

from sparkit import compile_plan, load_recipe
from sparkit.checks.activation import check_resolved_args, check_tool_calls
from sparkit.checks.evidence import ServerEvidence, parse_server_info
from sparkit.contract.checks import Status


def _evidence(**args) -> ServerEvidence:
    return ServerEvidence("embedded", server_info=parse_server_info({"version": "x", **args}))


def test_the_default_recipe_expects_ling3_and_passes_when_the_server_parses_with_it():
    plan = compile_plan(load_recipe("tiny"))
    result = check_tool_calls(plan, _evidence(tool_call_parser="ling3"))
    assert result.status is Status.PASS and "ling3" in result.detail and "JSON-array grammar" in result.detail


@pytest.mark.parametrize("reported", [None, "hermes"])
def test_a_server_that_does_not_run_the_recipes_parser_fails_naming_both(reported):
    plan = compile_plan(load_recipe("tiny"))
    result = check_tool_calls(plan, _evidence(tool_call_parser=reported))
    assert result.status is Status.FAIL and "ling3" in result.detail and (reported or "none") in result.detail
    assert "server.tool_call_parser" in result.fix
    # the resolved-args check names the difference too
    assert check_resolved_args(plan, _evidence(tool_call_parser=reported, constrained_json_disable_any_whitespace=True)
                               ).status is Status.FAIL


def test_a_recipe_without_a_parser_says_parsing_is_off():
    plan = compile_plan(load_recipe("tiny/tiny-sglang"))
    result = check_tool_calls(plan, _evidence(tool_call_parser=None))
    assert result.status is Status.SKIP and result.detail.startswith("off:") and "server.tool_call_parser" in result.detail
    assert check_tool_calls(plan, _evidence(tool_call_parser="ling3")).status is Status.PASS  # on outside the recipe: said


def test_auto_passes_with_whatever_sglang_resolved_and_fails_with_nothing():
    plan = compile_plan(load_recipe("ling-3.0-flash/tp4-baseline", ["server.tool_call_parser=auto"]))
    assert check_tool_calls(plan, _evidence(tool_call_parser="ling3")).status is Status.PASS
    assert check_tool_calls(plan, _evidence(tool_call_parser=None)).status is Status.FAIL


def test_unreadable_args_warn_when_the_recipe_asks_for_a_parser():
    plan = compile_plan(load_recipe("tiny"))
    assert check_tool_calls(plan, ServerEvidence("embedded")).status is Status.WARN
