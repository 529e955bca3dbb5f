"""sparkit's SGLang plugin: off unless enabled, and every hook target exists in sglang 0.5.23."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points, version

import pytest

from _sglang_source import find_class, find_function, module_ast, resolve

pytest.importorskip("sglang")


@pytest.fixture
def registry():
    from sglang.srt.plugins.hook_registry import HookRegistry

    saved = {k: list(v) for k, v in HookRegistry._hooks.items()}
    HookRegistry._hooks.clear()
    yield HookRegistry
    HookRegistry._hooks.clear()
    HookRegistry._hooks.update(saved)


def test_installed_sglang_is_the_version_the_hooks_target():
    assert version("sglang") == "0.5.23"


def test_entry_point_is_declared_for_sglangs_plugin_group():
    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "sparkit"]
    assert [ep.value for ep in eps] == ["sparkit.engines.sglang.plugin:register"]
    assert eps[0].load() is importlib.import_module("sparkit.engines.sglang.plugin").register


@pytest.mark.parametrize("value", [None, "", "0", "no"])
def test_without_sparkits_variable_no_hook_is_registered(registry, monkeypatch, value):
    from sparkit.engines.sglang import plugin

    if value is None:
        monkeypatch.delenv(plugin.ENABLE_ENV, raising=False)
    else:
        monkeypatch.setenv(plugin.ENABLE_ENV, value)
    plugin.register()
    assert dict(registry._hooks) == {}


def test_with_sparkits_variable_every_target_gets_an_after_hook(registry, monkeypatch):
    from sglang.srt.plugins.hook_registry import HookType

    from sparkit.engines.sglang import plugin

    monkeypatch.setenv(plugin.ENABLE_ENV, "1")
    plugin.register()
    registered = {t: [ht for ht, _fn, _src in hooks] for t, hooks in registry._hooks.items()}
    assert registered == {t: [HookType.AFTER] for t, _ in plugin.hook_targets()}
    fns = {t: hooks[0][1] for t, hooks in registry._hooks.items()}
    assert fns[plugin.LOAD_MODEL_TARGET] is plugin.after_load_model
    assert fns[plugin.EAGLE_INIT_LM_HEAD_TARGET] is plugin.after_init_lm_head


@pytest.mark.parametrize("target", [
    "sglang.srt.model_executor.model_runner.ModelRunner.load_model",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.init_lm_head",
    "sglang.srt.speculative.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker.init_lm_head",
    "sglang.srt.models.dspark.DSparkDraftMixin.attach_shared_modules",
])
def test_every_hook_target_resolves_in_the_installed_sglang(target):
    from sparkit.engines.sglang import plugin

    assert target in [t for t, _ in plugin.hook_targets()]
    assert resolve(target) is not None


def test_the_resolver_rejects_a_target_that_does_not_exist():
    with pytest.raises(AssertionError):
        resolve("sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.no_such_method")
    with pytest.raises(AssertionError):
        resolve("sglang.srt.model_executor.no_such_module.ModelRunner.load_model")


def test_hooked_methods_are_the_ones_sglang_calls():
    """load_model runs from ModelRunner.initialize; init_lm_head from the draft workers'
    alloc_memory_pool (the scheduler calls it once pools exist, before CUDA graphs)."""
    runner = find_class(module_ast("sglang.srt.model_executor.model_runner"), "ModelRunner")
    init = find_function(runner.body, "initialize")
    assert "self.load_model()" in _src("sglang.srt.model_executor.model_runner", init)
    for module, cls in [("sglang.srt.speculative.eagle_worker_v2", "EagleDraftWorker"),
                        ("sglang.srt.speculative.multi_layer_eagle_worker_v2", "MultiLayerEagleDraftWorker")]:
        node = find_class(module_ast(module), cls)
        assert "self.init_lm_head()" in _src(module, find_function(node.body, "alloc_memory_pool"))
        # The hooks read these attributes of the worker.
        init_src = _src(module, find_function(node.body, "__init__"))
        assert "self.target_worker = target_worker" in init_src
        assert "self.draft_runner" in init_src


def test_the_runner_attributes_the_hook_reads_exist():
    runner = find_class(module_ast("sglang.srt.model_executor.model_runner"), "ModelRunner")
    src = _src("sglang.srt.model_executor.model_runner", find_function(runner.body, "__init__"))
    for attr in ("self.is_draft_worker = is_draft_worker", "self.server_args = server_args",
                 "self.gpu_id = gpu_id"):
        assert attr in src
    load_src = _src("sglang.srt.model_executor.model_runner", find_function(runner.body, "load_model"))
    assert "self.model" in load_src


def _src(module, node):
    import ast

    from _sglang_source import module_path

    return ast.get_source_segment(module_path(module).read_text(), node)


def test_why_the_plugin_shares_the_head_itself_rather_than_through_set_lm_head_from_target(registry):
    """SGLang's EAGLE worker calls a draft's set_lm_head_from_target() when its class has one. For
    Ling's NextN draft the plugin would have to add it, and nothing in 0.5.23 makes that clean
    (plugin.py's docstring): if one of these facts changes, revisit the choice."""
    import ast
    import logging

    nextn = find_class(module_ast("sglang.srt.models.bailing_moe_nextn"), "BailingMoeForCausalLMNextN")
    assert find_function(nextn.body, "set_lm_head_from_target") is None
    # The model registry holds the class in the module's EntryClass list: a class REPLACE hook
    # (setattr on the module) would not reach it.
    tree = module_ast("sglang.srt.models.bailing_moe_nextn")
    entry = [n for n in tree.body if isinstance(n, ast.Assign) and any(
        getattr(t, "id", None) == "EntryClass" for t in n.targets)]
    assert [ast.unparse(n.value) for n in entry] == ["[BailingMoeForCausalLMNextN]"]
    # The multi-layer worker never calls it: only the AFTER hook on init_lm_head covers both.
    multi = find_class(module_ast("sglang.srt.speculative.multi_layer_eagle_worker_v2"), "MultiLayerEagleDraftWorker")
    assert "set_lm_head_from_target" not in _src("sglang.srt.speculative.multi_layer_eagle_worker_v2",
                                                 find_function(multi.body, "init_lm_head"))
    eagle = find_class(module_ast("sglang.srt.speculative.eagle_worker_v2"), "EagleDraftWorker")
    assert "set_lm_head_from_target" in _src("sglang.srt.speculative.eagle_worker_v2",
                                             find_function(eagle.body, "init_lm_head"))
    # And the hook registry cannot add a method a class lacks: it getattr()s the target first.
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    target = "sglang.srt.plugins.hook_registry.HookRegistry.set_lm_head_from_target"
    HookRegistry.register(target, lambda *a, **k: None, HookType.REPLACE)
    logging.getLogger("sglang.srt.plugins.hook_registry").disabled = True
    try:
        HookRegistry.apply_hooks()
    finally:
        logging.getLogger("sglang.srt.plugins.hook_registry").disabled = False
    assert not hasattr(HookRegistry, "set_lm_head_from_target")
    HookRegistry._patched.discard(target)
