"""The plugin reports the SGLANG_* switches of the engine process's environment as SGLang 0.5.23
reads them (its own registry, sglang.srt.environ.envs, imported here: it runs on a CPU), so the
startup checks can tell a switch that took effect from one the engine dropped, ignores or cannot
read (issue 38, item 3)."""

from __future__ import annotations

import types

import pytest

pytest.importorskip("sglang")
torch = pytest.importorskip("torch")


@pytest.fixture
def clean_env(monkeypatch):
    import os

    for name in [n for n in os.environ if n.startswith("SGLANG_")]:
        monkeypatch.delenv(name)
    return monkeypatch


def test_a_switch_is_reported_with_what_sglang_reads_from_it(clean_env):
    from sparkit.engines.sglang.report import engine_switches

    clean_env.setenv("SGLANG_ENABLE_METADATA_GLUE_GRAPH", "1")
    clean_env.setenv("SGLANG_OPT_GATE_GEMV_MODE", "2")
    got = engine_switches()
    assert set(got) == {"SGLANG_ENABLE_METADATA_GLUE_GRAPH", "SGLANG_OPT_GATE_GEMV_MODE"}
    glue = got["SGLANG_ENABLE_METADATA_GLUE_GRAPH"]
    assert (glue.value, glue.effective, glue.default, glue.known, glue.invalid) == ("1", True, False, True, None)
    gemv = got["SGLANG_OPT_GATE_GEMV_MODE"]
    assert (gemv.effective, gemv.default) == (2, 1)


def test_a_value_sglang_cannot_read_runs_its_default_and_says_why(clean_env):
    """SGLang warns and falls back to the default for 'on' (EnvBool takes 1/0/true/false/yes/no/y/n):
    the switch is silently off."""
    from sparkit.engines.sglang.report import engine_switches

    clean_env.setenv("SGLANG_ENABLE_METADATA_GLUE_GRAPH", "on")
    glue = engine_switches()["SGLANG_ENABLE_METADATA_GLUE_GRAPH"]
    assert glue.value == "on" and glue.effective is False and glue.default is False
    assert glue.invalid and "not a valid boolean" in glue.invalid


def test_a_name_sglang_does_not_have_is_reported_as_unknown(clean_env):
    from sparkit.engines.sglang.report import engine_switches

    clean_env.setenv("SGLANG_ENABLE_FUSED_VERIFY_EXTEND_GRAPH", "1")  # the TP4 study's dev-branch switch
    switch = engine_switches()["SGLANG_ENABLE_FUSED_VERIFY_EXTEND_GRAPH"]
    assert switch.known is False and switch.value == "1" and switch.effective is None


def test_a_secret_field_is_reported_without_its_value(clean_env, monkeypatch):
    from sglang.srt import environ

    from sparkit.engines.sglang.report import engine_switches

    secret = environ.EnvStr(None, secret=True)
    secret.name = "SGLANG_TEST_SECRET_TOKEN"
    monkeypatch.setattr(environ.envs, "SGLANG_TEST_SECRET_TOKEN", secret, raising=False)
    clean_env.setenv("SGLANG_TEST_SECRET_TOKEN", "hunter2")
    switch = engine_switches()["SGLANG_TEST_SECRET_TOKEN"]
    assert switch.value == "<secret>" and switch.effective == "<secret>" and "hunter2" not in repr(switch)


def test_nothing_set_reports_nothing(clean_env):
    from sparkit.engines.sglang.report import engine_switches

    assert engine_switches() == {}


def test_the_report_the_plugin_writes_carries_the_switches(clean_env, tmp_path):
    """The plugin's own hook, as SGLang calls it after the weights load (the lm_head left as loaded:
    the plan enables the plugin for the report alone with SPARKIT_FP8_LM_HEAD=0)."""
    from sparkit.engines.activation_report import load_reports
    from sparkit.engines.sglang import plugin

    clean_env.setenv("SPARKIT_REPORT_DIR", str(tmp_path))
    clean_env.setenv("SPARKIT_FP8_LM_HEAD", "0")
    clean_env.setenv("SGLANG_ENABLE_METADATA_GLUE_GRAPH", "1")
    clean_env.setenv("SGLANG_OPT_FUSED_KDA_VERIFY", "true")
    clean_env.setattr(plugin, "_STATE", {"target_runner": None, "drafts": [], "notes": []})
    model = torch.nn.Module()
    model.lm_head = torch.nn.Linear(8, 16, bias=False).to(torch.bfloat16)
    runner = types.SimpleNamespace(model=model, is_draft_worker=False, device="cpu", gpu_id=0, tp_rank=0, tp_size=1,
                                   server_args=types.SimpleNamespace())
    plugin.after_load_model(None, runner)
    (rep,) = load_reports(tmp_path)
    assert rep.target.lm_head.weight_dtype == "bfloat16"
    assert {n: (s.value, s.effective) for n, s in rep.engine_env.items()} == {
        "SGLANG_ENABLE_METADATA_GLUE_GRAPH": ("1", True), "SGLANG_OPT_FUSED_KDA_VERIFY": ("true", True)}
