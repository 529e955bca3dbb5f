"""The evidence parsers, phase detection, failure diagnosis and activation checks on what real
SGLang 0.5.23 wrote on an H200 (tests/fixtures/sglang-0.5.23-h200/, verbatim)."""

from __future__ import annotations

import json

import pytest

from sparkit.checks.activation import (
    check_acceptance,
    check_ignored_settings,
    check_lm_head_dtype,
    check_moe_runner,
    check_resolved_args,
    check_shared_lm_head,
)
from sparkit.checks.evidence import ServerEvidence, parse_server_info
from sparkit.contract.checks import Status
from sparkit.engines.activation_report import ActivationReport
from sparkit.engines.sglang.log import detect_phase, diagnose_failure, parse_log, phase_timeline

from _shared import REPO_DIR

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
    from sparkit.planning.compile import compile_plan
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
    # SGLang reset a default the recipe does not set: recorded, not a warning about the recipe
    ignored = check_ignored_settings(plan, ev)
    assert ignored.status == Status.PASS and "reset 1 default" in ignored.detail
    assert any("Max running requests is reset" in e for e in ignored.data["engine_defaults_rewritten"])
    import dataclasses

    asked = dataclasses.replace(plan, argv=plan.argv + ["--max-running-requests", "64"])
    rewritten = check_ignored_settings(asked, ev)  # the same line, now about a setting the plan passed
    assert rewritten.status == Status.WARN and any("Max running requests is reset" in e for e in rewritten.evidence)


def test_the_resolved_args_check_fails_on_the_real_body_when_the_recipe_asked_otherwise():
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    plan = compile_plan(load_recipe("tiny/tiny-sglang", ["model.path=/tmp/models/tiny-bailing-mtp", "model.served_name=null"]))
    ev = ServerEvidence(engine="sglang", server_info=parse_server_info(json.loads(_text("bailing-nextn-nograph.server_info.json"))))
    result = check_resolved_args(plan, ev)  # the recipe says NEXTN 3/1/4; the real server ran 2/1/3
    assert result.status == Status.FAIL
    assert "speculative_num_steps: asked 3, server runs 2" in result.detail


# -- sparkit's own session on the H200 (benchmarks/sglang_h200/session.sh): tiny-ling, trained ------


def _evidence_of(run: str) -> tuple:
    """(plan, evidence, recorded checks) of a real run directory captured on the H200."""
    from sparkit.checks.evidence import ProbeResult
    from sparkit.contract.plan import LaunchPlan
    from sparkit.engines.activation_report import load_reports

    directory = FIXTURES / run
    plan = LaunchPlan.from_dict(json.loads((directory / "plan.json").read_text()))
    info = directory / "server_info.json"
    ev = ServerEvidence(
        engine="sglang",
        server_info=parse_server_info(json.loads(info.read_text())) if info.exists() else None,
        log=parse_log((directory / "server.log").read_text(errors="replace")),
        reports=load_reports(directory),
        probe=ProbeResult.from_dict(json.loads((directory / "probe.json").read_text())) if (directory / "probe.json").exists() else None,
    )
    recorded = json.loads((directory / "checks.json").read_text())["results"] if (directory / "checks.json").exists() else []
    return plan, ev, recorded


@pytest.mark.parametrize("run", ["sparkit-main", "sparkit-wrong-draft", "sparkit-v3"])
def test_the_checks_give_what_they_gave_on_the_real_engine(run):
    from sparkit.checks.activation import evaluate

    plan, ev, recorded = _evidence_of(run)
    now = {r.name: r.status.value for r in evaluate(plan, ev)}
    then = {r["name"]: r["status"] for r in recorded}
    # Changed since the session, following what the engine wrote: SGLang's reset of a default the
    # recipe does not set ("Max running requests is reset to 48") no longer makes this a warning.
    assert then.pop("ignored_settings") == "warn" and now.pop("ignored_settings") == "pass"
    # Added since: the session's plans state no reference perplexity, so the known-answer check skips.
    assert "known_answer" not in then and now.pop("known_answer") == "skip"
    # Added since: the expert weights of every MoE layer, from the same activation reports.
    assert "weights" not in then and now.pop("weights") == "pass"
    # Added since: DSpark's checks, which skip for NEXTN.
    assert [now.pop(name) for name in ("shared_embedding", "block_size")] == ["skip", "skip"]
    # Added since: the engine switches. The captured directory has no engine process whose
    # environment could be read and these recipes set no SGLANG_* switch, but the flags the session's
    # recipes pass (--max-total-tokens 65536, --load-format dummy) are in what the real SGLang reported.
    switches = next(r for r in evaluate(plan, ev) if r.name == "engine_switches")
    assert any(line.startswith("flag --") and ": the server reports " in line for line in switches.evidence)
    assert "engine_switches" not in then and now.pop("engine_switches") == "pass"
    # Added since: whether tool calls are parsed; these ran no --tool-call-parser (server_info: null).
    assert "tool_calls" not in then and now.pop("tool_calls") == "skip"
    assert now == then


def test_the_trained_tiny_ling_on_real_sglang_passes_every_check_it_should():
    plan, ev, _ = _evidence_of("sparkit-main")
    assert check_lm_head_dtype(plan, ev).status == Status.PASS
    assert check_shared_lm_head(plan, ev).status == Status.PASS
    accept = check_acceptance(plan, ev)
    assert accept.status == Status.PASS and accept.data["accept_length"] == pytest.approx(144 / 40)
    assert ev.server_info.args["speculative_algorithm"] == "EAGLE" and ev.server_info.version == "0.5.23"
    assert ev.log.startup_timings["cuda_graph.target_verify"] == pytest.approx(34.38)
    assert [p for p, _ in phase_timeline((FIXTURES / "sparkit-main" / "server.log").read_text())][-1] == "ready"
    assert ev.reports[0].draft.model_class == "BailingMoeForCausalLMNextN"


def test_a_wrong_draft_on_real_sglang_fails_acceptance_naming_the_draft():
    plan, ev, _ = _evidence_of("sparkit-wrong-draft")
    result = check_acceptance(plan, ev)
    assert result.status == Status.FAIL and result.data["accept_length"] < 1.1
    assert "tiny-ling-s1-n40-hf-bfloat16" in result.cause and "wrong draft" in result.cause


def test_the_trap_on_real_sglang_fails_loudly_and_is_named():
    """Stock SGLang leaves the NEXTN draft the target head's FP8 *tensor*: it does not decode
    garbage silently, its draft graph capture fails ('"addmm_cuda" not implemented for
    'Float8_e4m3fn''). sparkit names the trap from the log, and the report the plugin wrote
    before the crash already shows the unshared head."""
    from sparkit.engines.activation_report import load_reports

    directory = FIXTURES / "sparkit-trap"
    log = (directory / "server.log").read_text(errors="replace")
    diagnosis = diagnose_failure(log, returncode=1)
    assert diagnosis.cause == "FP8 weight read by a BF16 kernel" and "shared-head trap" in diagnosis.detail
    assert "Float8_e4m3fn" in diagnosis.line and "SPARKIT_SHARE_LM_HEAD" in diagnosis.hint
    plan, ev, _ = _evidence_of("sparkit-trap")
    ev.reports = load_reports(directory)
    shared = check_shared_lm_head(plan, ev)
    assert shared.status == Status.FAIL and "BF16 method" in shared.cause


def test_a_sampled_request_without_flashinfer_is_diagnosed():
    """Seen on the H200: `sparkit verify`'s sampled requests killed the NEXTN server (its verify
    step imports flashinfer's top_p_renorm_prob for temperature > 0)."""
    log = (FIXTURES / "sparkit-verify-sampled" / "server.log").read_text(errors="replace")
    assert "top_p_renorm_prob" in log
    diagnosis = diagnose_failure(log, returncode=1)
    assert diagnosis.cause == "missing Python module" and "flashinfer" in diagnosis.detail
    assert "temperature > 0" in diagnosis.hint


def test_humming_online_quantization_fails_in_the_pinned_versions_and_the_cause_is_named():
    log = (FIXTURES / "sparkit-humming" / "server.log").read_text(errors="replace")
    diagnosis = diagnose_failure(log, returncode=1)
    assert diagnosis.cause == "engine error" and "has_global_scale" in diagnosis.detail


def test_the_memory_lines_of_real_starts():
    """SGLang's own memory figures, as the pool prediction is compared with them
    (sparkit.engines.sglang.log.parse_memory): the V3 + NEXTN start and a capped BailingMoeV2 one."""
    from sparkit.engines.sglang.log import parse_memory

    v3 = parse_memory(_text("v3-nextn-nograph.log"))
    assert v3.pre_model_load_gb == 139.13 and v3.available_after_weights_gb == 139.09 and v3.weights_gb == 0.03
    assert [load["model_class"] for load in v3.loads] == ["BailingMoeV3ForCausalLM", "BailingMoeForCausalLMNextN"]
    assert v3.mamba == {"max_mamba_cache_size": 16263, "conv_state_gb": 0.42, "ssm_state_gb": 11.91,
                        "intermediate_ssm_state_cache_gb": 0.11, "intermediate_conv_window_cache_gb": 0.0}
    assert v3.kv == [{"dtype": "torch.bfloat16", "tokens": 13614799, "kv_gb": 14.61}] * 2
    assert v3.pool_end_avail_gb == [111.94, 97.33]
    assert v3.summary == {"max_total_num_tokens": 13614799, "max_running_requests": 48, "context_len": 4096,
                          "available_gpu_mem_gb": 96.22}
    main = parse_memory(_text("sparkit-main/server.log"))
    assert [k["tokens"] for k in main.kv] == [65536, 65536] and main.kv[0]["kv_gb"] == 0.12  # K + V
    assert main.state_error is None and main.no_kv_error is None


def test_no_room_for_the_pools_is_diagnosed_as_such():
    """The line SGLang logs when a second server started beside another finds its memory gone (its
    own format string, from the installed source, with the CEO's figure): not a generic OOM."""
    import importlib.util
    import re
    from pathlib import Path

    from sparkit.engines.sglang.log import parse_memory

    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("sglang is not installed")
    source = (Path(list(spec.submodule_search_locations)[0]) / "srt" / "mem_cache" / "kv_cache_configurator.py").read_text()
    parts = re.search(r'f"(Not enough GPU memory for hybrid[^"]*)"\s*f"(Computed[^"]*)"\s*f"(\(total_rest[^"]*)"\s*'
                      r'f"(mamba_cache_per_req[^"]*)"', source)
    template = "".join(parts.groups())
    values = {"max_mamba_cache_size": -1160, "total_rest_memory": -9.30, "stage_per_req": 10.85 * (1 << 20)}

    def fill(match):  # each {expression:spec} of the f-string, by the variable it names
        expression, _, spec = match.group(1).partition(":")
        name = next(n for n in values if n in expression)
        value = values[name] / (1 << 20) if "/ (1 << 20)" in expression else values[name]
        return format(value, spec)

    line = "RuntimeError: " + re.sub(r"\{([^{}]*)\}", fill, template)
    assert "total_rest_memory=-9.30 GB" in line
    d = diagnose_failure(f"[2026-12-01 12:00:00] Load weight end. type=BailingMoeV3ForCausalLM\n{line}\n", 1)
    assert d.cause == "no memory left for the pools" and "--max-mamba-cache-size" in d.hint and d.line == line.strip()
    assert parse_memory(line).state_error == {"max_mamba_cache_size": -1160, "total_rest_memory_gb": -9.3,
                                              "mamba_cache_per_req_mb": 10.85}

