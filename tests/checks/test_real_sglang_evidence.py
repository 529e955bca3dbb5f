"""The evidence parsers, phase detection, failure diagnosis and activation checks on what real
SGLang 0.5.23 wrote on an H200 (tests/fixtures/sglang-0.5.23-h200/, verbatim)."""

from __future__ import annotations

import json

import pytest

from _shared import REPO_DIR
from sparkit.checks.activation import (
    ServerEvidence,
    check_acceptance,
    check_ignored_settings,
    check_lm_head_dtype,
    check_moe_runner,
    check_resolved_args,
    check_shared_lm_head,
)
from sparkit.checks.evidence import detect_phase, diagnose_failure, parse_log, parse_server_info, phase_timeline
from sparkit.checks.results import Status
from sparkit.engines.activation import ActivationReport

FIXTURES = REPO_DIR / "tests" / "fixtures" / "sglang-0.5.23-h200"


def _text(name: str) -> str:
    return (FIXTURES / name).read_text(errors="replace")


def test_a_real_nextn_log_yields_every_piece_of_evidence():
    ev = parse_log(_text("bailing-nextn-cudagraph.log"))
    assert ev.server_args["speculative_algorithm"] == "EAGLE" and ev.server_args["moe_runner_backend"] == "triton"
    assert len(ev.server_args) > 500  # the whole resolved ServerArgs, read from a Python dict repr
    assert [w.model_class for w in ev.weight_loads] == ["BailingMoeV2ForCausalLM", "BailingMoeForCausalLMNextN"]
    assert ev.draft_load.model_class == "BailingMoeForCausalLMNextN" and ev.target_load.elapsed_s == pytest.approx(0.13)
    assert ev.fp8_lm_head and "tp rank 0/1" in ev.lines["fp8_lm_head"]  # the plugin's own line
    assert ev.graph_captures == 4 and ev.graph_capture_failed is None
    assert ev.ready and ev.last_accept_length == 1.0 and all(d.graph for d in ev.decode_stats)
    assert ev.startup_timings["cuda_graph.prefill"] == pytest.approx(56.11)
    assert ev.startup_timings["tokenizer_e2e"] == pytest.approx(113.78)
    assert any("Max running requests is reset to 48" in r for r in ev.rewrites)


def test_the_phases_of_a_real_start_in_order_with_their_times():
    text = _text("bailing-nextn-cudagraph.log")
    timeline = phase_timeline(text)
    assert [p for p, _ in timeline] == ["loading weights", "allocating the KV cache", "capturing CUDA graphs",
                                       "HTTP server up, warming up", "ready"]
    seconds = [s for _, s in timeline]
    assert seconds == sorted(seconds) and seconds[-1] == 134.0  # 08:33:31 -> 08:35:45
    lines = text.splitlines()
    cut = next(i for i, line in enumerate(lines) if "Capture target verify CUDA graph begin" in line)
    assert detect_phase("\n".join(lines[:cut + 1])) == "capturing CUDA graphs"
    cut = next(i for i, line in enumerate(lines) if "Load weight begin" in line)
    assert detect_phase("\n".join(lines[:cut + 1])) == "loading weights"
    assert detect_phase(text) == "ready"


def test_the_real_flash_mla_failure_is_diagnosed_with_its_fix():
    diagnosis = diagnose_failure(_text("bailing-nextn-cudagraph-FAILED.first200.log"), returncode=1)
    assert diagnosis.cause == "missing Python module"
    assert "flash_mla" in diagnosis.detail and "sgl-flash-mla" in diagnosis.hint
    assert diagnosis.line == "ModuleNotFoundError: No module named 'flash_mla'"


def test_a_benign_skipped_model_import_is_not_taken_for_the_cause():
    # Every real SGLang log has "Ignore import error when loading sglang.srt.models.midashenglm:
    # No module named 'torchaudio.functional'"; a start that then fails otherwise is not blamed on it.
    text = _text("v3-nextn-nograph.log")
    assert "No module named 'torchaudio.functional'" in text
    diagnosis = diagnose_failure(text + "\n[2026-12-01 08:50:00] RuntimeError: CUDA error: an illegal memory access", returncode=1)
    assert diagnosis.cause == "engine error" and "illegal memory access" in diagnosis.detail


def test_real_server_info_and_activation_report():
    info = parse_server_info(json.loads(_text("bailing-nextn-nograph.server_info.json")))
    assert info.version == "0.5.23" and info.args["speculative_algorithm"] == "EAGLE"
    assert info.avg_spec_accept_length == 1.0  # internal_states[0]
    report = ActivationReport.from_dict(json.loads(_text("bailing-nextn-nograph.activation-tp0.json")))
    assert report.target.lm_head.weight_dtype == "float8_e4m3fn" and report.draft.lm_head.shared_with_target
    v3 = ActivationReport.from_dict(json.loads(_text("v3-nextn-nograph.activation-tp0.json")))
    assert v3.target.model_class == "BailingMoeV3ForCausalLM" and v3.draft.model_class == "BailingMoeForCausalLMNextN"
    assert v3.draft.lm_head.module_id == v3.target.lm_head.module_id


def _plan_of_that_run():
    """The plan sparkit compiles for the kit's run: tiny-sglang's stack at NEXTN 2/1/3."""
    from sparkit.recipes.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    return compile_plan(load_recipe("tiny/tiny-sglang", [
        "model.path=/tmp/models/tiny-bailing-mtp", "model.served_name=null",
        "stack.speculative={method: nextn, num_steps: 2, eagle_topk: 1, num_draft_tokens: 3}",
        "server.extra_args=[--load-format, dummy]", "server.cuda_graph.prefill=true",
    ]))


def test_the_checks_on_the_real_evidence_of_that_run():
    plan = _plan_of_that_run()
    ev = ServerEvidence(
        engine="sglang",
        server_info=parse_server_info(json.loads(_text("bailing-nextn-nograph.server_info.json"))),
        log=parse_log(_text("bailing-nextn-cudagraph.log")),
        reports=[ActivationReport.from_dict(json.loads(_text("bailing-nextn-nograph.activation-tp0.json")))],
    )
    resolved = check_resolved_args(plan, ev)
    assert resolved.status == Status.PASS, resolved.detail
    from sparkit.checks.activation import expected_server_args

    assert expected_server_args(plan)["speculative_algorithm"] == "EAGLE"  # NEXTN, as SGLang reports it
    assert check_moe_runner(plan, ev).status == Status.PASS
    head = check_lm_head_dtype(plan, ev)
    assert head.status == Status.PASS and "top 4 candidates re-scored" in head.detail
    assert check_shared_lm_head(plan, ev).status == Status.PASS
    accept = check_acceptance(plan, ev)  # random weights: 1.00, from /server_info's internal state
    assert accept.status == Status.FAIL and "1.00" in accept.detail
    ignored = check_ignored_settings(plan, ev)
    assert ignored.status == Status.WARN and any("Max running requests is reset" in e for e in ignored.evidence)


def test_the_resolved_args_check_fails_on_the_real_body_when_the_recipe_asked_otherwise():
    from sparkit.recipes.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    plan = compile_plan(load_recipe("tiny/tiny-sglang", ["model.path=/tmp/models/tiny-bailing-mtp", "model.served_name=null"]))
    ev = ServerEvidence(engine="sglang", server_info=parse_server_info(json.loads(_text("bailing-nextn-nograph.server_info.json"))))
    result = check_resolved_args(plan, ev)  # the recipe says NEXTN 3/1/4; the real server ran 2/1/3
    assert result.status == Status.FAIL
    assert "speculative_num_steps: asked 3, server runs 2" in result.detail
