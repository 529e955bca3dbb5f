"""The memory fit counts the FP8 lm_head by the path the plan provides it (its provisions), not by
the environment: a recipe that exports SGLANG_ENABLE_FP8_LM_HEAD itself on a stock SGLang, whose
registry lacks the variable, still gets sparkit's plugin, which keeps the bf16 head beside the FP8
copy for exact re-scoring."""

from __future__ import annotations

import json

from sparkit.engines.sglang import adapter
from sparkit.memory.fit import compute_fit
from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import load_recipe

FP8_ENV = "SGLANG_ENABLE_FP8_LM_HEAD"


def _head(tiny_model_dir) -> tuple[int, int]:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    return config["vocab_size"], config["hidden_size"]


def _provider(plan) -> str:
    return next(p.provider for p in plan.provisions if p.optimisation == "lm_head=fp8")


def _terms(fit) -> dict[str, int]:
    return {t.name: t.bytes for t in fit.terms}


def test_a_recipe_exporting_the_patched_switch_on_stock_sglang_is_counted_as_the_plugin(tiny_model_dir):
    plan = compile_plan(load_recipe("tiny/tiny-sglang", [f"server.env={{{FP8_ENV}: '1'}}"]))
    assert plan.env[FP8_ENV] == "1" and _provider(plan) == "sparkit-plugin"  # 0.5.23 ignores the variable
    vocab, hidden = _head(tiny_model_dir)
    fit = compute_fit(plan, None)
    terms = _terms(fit)
    assert terms["FP8 lm_head copy (sparkit plugin)"] == vocab * hidden + vocab * 4
    assert not any("SGLang's own" in name for name in terms)
    assert any("stays loaded for exact re-scoring" in note for note in fit.notes)


def test_sglangs_own_fp8_head_replaces_the_bf16_weight(tiny_model_dir, monkeypatch):
    real = adapter.env_registry()
    monkeypatch.setattr(adapter, "env_registry", lambda: real | {FP8_ENV})
    plan = compile_plan(load_recipe("tiny/tiny-sglang"))
    assert _provider(plan) == "sglang-env"
    vocab, hidden = _head(tiny_model_dir)
    terms = _terms(compute_fit(plan, None))
    head = terms["lm_head (checkpoint)"]
    assert terms["FP8 lm_head (SGLang's own, replaces the bf16 weight)"] == vocab * hidden + vocab * 4 - head
    assert "FP8 lm_head copy (sparkit plugin)" not in terms
