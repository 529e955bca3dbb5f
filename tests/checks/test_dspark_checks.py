"""The DSpark startup checks, each failing for its real reason and passing: the draft embeds with the
target's module, the block in use is the recipe's and the draft config's, and the accept length
clears a floor an untrained draft does not. The evidence is what each engine writes (the embedded
engine's own activation report, sparkit's SGLang report's shape, /server_info bodies)."""

from __future__ import annotations

import pytest

from sparkit.checks.activation import (
    check_acceptance,
    check_block_size,
    check_resolved_args,
    check_shared_embedding,
    check_shared_lm_head,
)
from sparkit.checks.evidence import ProbeRequest, ProbeResult, ServerEvidence, parse_server_info
from sparkit.contract.checks import Status
from sparkit.engines.activation_report import ActivationReport
from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import load_recipe


@pytest.fixture(scope="module")
def plan():
    return compile_plan(load_recipe("tiny/tiny-dspark"))


@pytest.fixture(scope="module")
def engine_report(plan, tiny_model_dir, dspark_draft_dir):
    """The activation report and resolved args of the embedded engine started with tiny-dspark's
    own command line (FP8 head), on the CPU."""
    pytest.importorskip("torch")
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import build_arg_parser, engine_config

    argv = plan.argv[plan.argv.index("sparkit.engines.embedded") + 1:]
    args = build_arg_parser().parse_args([*argv, "--model-path", str(tiny_model_dir), "--device", "cpu",
                                          "--speculative-draft-model-path", str(dspark_draft_dir)])
    engine = EmbeddedEngine(engine_config(args))
    # /server_info: the engine's resolved args and the HTTP server's own options (routes.py), of
    # which this recipe sets one
    return engine.activation_report().to_dict(), {**engine.server_args(), "tool_call_parser": args.tool_call_parser}


def evidence(report: dict, args: dict, accept: float | None = 3.4) -> ServerEvidence:
    probe = ProbeResult(requests=[ProbeRequest("p", int(48 * 3), round(48 * 3 / accept), 50.0, 1.0)]) if accept else None
    return ServerEvidence(engine="embedded", server_info=parse_server_info(dict(args)),
                          reports=[ActivationReport.from_dict(report)], probe=probe)


def test_the_plan_of_tiny_dspark_states_what_the_checks_verify(plan):
    exp = plan.expectations
    assert (exp.speculative, exp.draft_shares_lm_head, exp.draft_shares_embedding) == ("dspark", True, True)
    assert (exp.block_size, exp.draft_block_size, exp.min_accept_length) == (None, 8, 2.0)
    assert exp.server_args["speculative_num_draft_tokens"] == 9 and exp.server_args["speculative_dspark_block_size"] == 8


def test_every_dspark_check_passes_on_what_the_engine_reports(plan, engine_report):
    report, args = engine_report
    ev = evidence(report, args)
    for check in (check_resolved_args, check_shared_lm_head, check_shared_embedding, check_block_size, check_acceptance):
        result = check(plan, ev)
        assert result.status == Status.PASS, (check.__name__, result.detail, result.evidence)


def test_a_draft_embedding_of_its_own_fails_naming_the_ranks(plan, engine_report):
    report, args = engine_report
    own = {**report, "models": {**report["models"], "draft": {**report["models"]["draft"],
                                                              "embed_tokens": {"module_id": 1, "shared_with_target": False}}}}
    result = check_shared_embedding(plan, evidence(own, args))
    assert result.status == Status.FAIL and "TP rank(s) [0]" in result.detail
    assert "embedding of its own" in result.cause


def test_a_report_that_does_not_say_which_embedding_is_a_warning_not_a_pass(plan, engine_report):
    report, args = engine_report
    silent = {**report, "models": {**report["models"], "draft": {**report["models"]["draft"], "embed_tokens": None}}}
    assert check_shared_embedding(plan, evidence(silent, args)).status == Status.WARN


def test_a_block_other_than_the_draft_configs_fails(plan, engine_report):
    report, args = engine_report
    other = {**report, "speculative": {**report["speculative"], "block_size": 4, "num_draft_tokens": 5}}
    result = check_block_size(plan, evidence(other, {**args, "speculative_num_draft_tokens": 5}))
    assert result.status == Status.FAIL
    assert "drafts blocks of 4, but the draft config's block_size is 8" in result.detail


def test_a_recipe_block_size_the_server_does_not_run_fails(engine_report):
    report, args = engine_report
    plan = compile_plan(load_recipe("tiny/tiny-dspark", ["stack.speculative.block_size=6"]))
    result = check_block_size(plan, evidence(report, args))
    assert result.status == Status.FAIL and "the recipe's speculative.block_size is 6" in result.detail


def test_without_a_report_the_block_size_is_read_from_the_resolved_args(plan, engine_report):
    _, args = engine_report
    ev = ServerEvidence(engine="sglang", server_info=parse_server_info(dict(args)))
    result = check_block_size(plan, ev)
    assert result.status == Status.PASS and result.data["source"] == "resolved speculative_num_draft_tokens - 1"


@pytest.mark.parametrize("accept, status", [(1.01, Status.FAIL), (1.9, Status.FAIL), (3.4, Status.PASS)])
def test_the_accept_length_floor_tells_an_untrained_draft_from_a_trained_one(plan, engine_report, accept, status):
    """1.01: what the untrained draft gets on the startup probe; 1.9: what a block draft that is
    useless can still reach on repetitive text (a NEXTN floor of 1.5 would pass it); 3.4: the
    trained draft (tests/embedded/test_dspark.py measures both)."""
    report, args = engine_report
    result = check_acceptance(plan, evidence(report, args, accept))
    assert result.status == status
    if status == Status.FAIL:
        assert "untrained" in result.cause
