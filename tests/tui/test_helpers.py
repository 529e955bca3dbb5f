"""Settings validation, code-block copying and the server summary."""

from __future__ import annotations

import pytest

from sparkit.runs import Run
from sparkit.tui.clipboard import code_blocks, copy_fallback, last_copy_path
from sparkit.tui.server_summary import merge, summarize_run, summarize_server_info
from sparkit.tui.settings import ChatSettings, parse_settings

GOOD = {"temperature": "0.6", "top_p": "0.95", "top_k": "29", "max_tokens": "512"}


def test_settings_parse_from_the_panels_fields():
    assert parse_settings(GOOD) == ChatSettings(temperature=0.6, top_p=0.95, top_k=29, max_tokens=512)
    assert parse_settings({**GOOD, "top_k": "-1", "temperature": "0"}).top_k == -1


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", "hot", "temperature: 'hot' is not a number"),
        ("temperature", "3", "temperature: must be between 0 (greedy) and 2"),
        ("top_p", "0", "top_p: must be in (0, 1]"),
        ("top_k", "0", "top_k: must be -1 (off) or at least 1"),
        ("top_k", "2.5", "top_k: '2.5' is not an integer"),
        ("max_tokens", "0", "max_tokens: must be at least 1"),
    ],
)
def test_bad_settings_name_the_field(field, value, message):
    with pytest.raises(ValueError) as info:
        parse_settings({**GOOD, field: value})
    assert str(info.value) == message


def test_code_blocks_are_found_including_one_cut_off_by_a_stop():
    reply = "Try:\n\n```python\nprint(1)\n```\n\nor\n\n~~~\nls -l\n~~~\n\nthen\n\n```bash\necho unfinished\n"
    assert code_blocks(reply) == ["print(1)\n", "ls -l\n", "echo unfinished\n"]
    assert code_blocks("no code here") == []


def test_copy_fallback_writes_the_text_where_it_can_be_found(sparkit_home):
    where = copy_fallback("hello\nworld")
    assert where[0] == str(last_copy_path())
    assert last_copy_path().read_text() == "hello\nworld"


def write_run(tmp_path, checks):
    run = Run(id="run-1", recipe_name="ling-flash-spark", recipe_path=None, engine="sglang", url="", host="", port=0, root=tmp_path)
    run.write_json("meta.json", {"recipe_name": "ling-flash-spark", "engine": "sglang"})
    run.write_json("plan.json", {"recipe_name": "ling-flash-spark", "served_model_name": "ling",
                                 "provisions": [{"optimisation": "lm_head=fp8"}]})
    if checks is not None:
        run.write_json("checks.json", checks)
    return run


def test_a_run_summary_shows_the_recipe_and_each_check(tmp_path):
    checks = [
        {"name": "moe_backend", "title": "MoE backend", "status": "pass", "detail": "humming"},
        {"name": "draft_head", "title": "draft shares lm_head", "status": "fail", "detail": "accept length 1.00"},
    ]
    summary = summarize_run(write_run(tmp_path, {"results": checks}))
    assert summary.recipe == "ling-flash-spark"
    assert ("provides", "lm_head=fp8") in summary.facts
    assert [(c.name, c.status) for c in summary.checks] == [("MoE backend", "pass"), ("draft shares lm_head", "fail")]
    # a bare list is read the same way
    assert len(summarize_run(write_run(tmp_path, checks)).checks) == 2


def test_a_run_without_checks_says_so(tmp_path):
    summary = summarize_run(write_run(tmp_path, None))
    assert summary.checks == [] and "checks.json missing" in summary.checks_note


def test_server_info_summary_uses_the_resolved_args(tmp_path):
    info = {
        "model_path": "/m/ling", "speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
        "moe_runner_backend": "humming", "enable_fp32_lm_head": False,
        "internal_states": [{"avg_spec_accept_length": 2.68}], "version": "0.5.23",
    }
    summary = summarize_server_info(info)
    facts = dict(summary.facts)
    assert facts["speculative"] == "EAGLE" and facts["MoE backend"] == "humming" and facts["server accept"] == "2.68"
    assert "fp32 lm_head" not in facts  # False flags are left out
    assert summary.checks == [] and "not started by sparkit" in summary.checks_note
    merged = merge(summarize_run(write_run(tmp_path, [])), summary)
    assert merged.recipe == "ling-flash-spark" and dict(merged.facts)["MoE backend"] == "humming"
