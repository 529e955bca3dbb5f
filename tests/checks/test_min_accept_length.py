"""The minimum accept length: one default (sparkit.contract.flag_table.DEFAULT_MIN_ACCEPT_LENGTH), which
compile writes into every speculative plan whose recipe states none; a plan that states none (one
written elsewhere, or with the value removed) is held only to beating a draft that is never accepted."""

from __future__ import annotations

import dataclasses

from sparkit.checks.activation import check_acceptance
from sparkit.checks.evidence import ProbeRequest, ProbeResult, ServerEvidence
from sparkit.contract.checks import Status
from sparkit.contract.flag_table import DEFAULT_MIN_ACCEPT_LENGTH
from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import load_recipe
from sparkit.recipes.schema import Checks


def _probe(accept: float) -> ServerEvidence:
    tokens = 60
    requests = [ProbeRequest(prompt="p", completion_tokens=tokens, spec_verify_ct=round(tokens / accept),
                             decode_tok_s=50.0, latency_s=1.0)]
    return ServerEvidence("embedded", probe=ProbeResult(requests=requests))


def test_a_speculative_recipe_without_a_minimum_is_held_to_1_5():
    plan = compile_plan(load_recipe("tiny", overrides=["checks.min_accept_length=null"]))
    assert plan.expectations.min_accept_length == DEFAULT_MIN_ACCEPT_LENGTH == 1.5
    assert check_acceptance(plan, _probe(1.4)).status is Status.FAIL  # 60 tokens / 43 verify steps
    assert check_acceptance(plan, _probe(1.6)).status is Status.PASS


def test_a_plan_stating_no_minimum_only_needs_some_drafts_accepted():
    plan = compile_plan(load_recipe("tiny"))
    plan.expectations = dataclasses.replace(plan.expectations, min_accept_length=None)
    assert check_acceptance(plan, _probe(1.2)).status is Status.PASS
    failed = check_acceptance(plan, _probe(1.0))
    assert failed.status is Status.FAIL and failed.data["min_accept_length"] == 1.0


def test_the_recipe_reference_states_the_one_default():
    doc = Checks.model_fields["min_accept_length"].description or ""
    assert f"default {DEFAULT_MIN_ACCEPT_LENGTH}" in doc
