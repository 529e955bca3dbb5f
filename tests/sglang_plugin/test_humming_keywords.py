"""The plugin's fix for humming's renamed keyword, against humming's real quantize_weight.

sglang 0.5.23's online humming quantization (HummingMoEMethod / HummingLinearMethod's weight
loaders) calls `quantize_weight(..., has_global_scale=...)`; humming-kernels 0.1.12, sglang's own
pin, renamed the keyword to `weight_scale_2_type`, and the H200 run died with a TypeError
(tests/fixtures/sglang-0.5.23-h200/sparkit-humming/server.log). These tests run sglang's own
weight loader (its installed source) against the installed humming 0.1.12 on CPU tensors:
without the plugin it fails as on the H200; with it the call gets through humming's argument
checks to the line that moves the weight to the GPU (on a CPU machine the first thing it cannot do;
on a GPU machine the quantisation runs to the end).
"""

from __future__ import annotations

import ast
import sys
import traceback
import types
from pathlib import Path

import pytest

from _sglang_source import bind_method, exec_functions, module_path

pytest.importorskip("sglang")
weight_module = pytest.importorskip("humming.utils.weight", reason="scripts/test installs humming-kernels (--no-deps)")
torch = pytest.importorskip("torch")

from humming import dtypes  # noqa: E402
from humming.schema import HummingWeightSchema  # noqa: E402

from sparkit.engines.sglang import plugin  # noqa: E402

FIXTURE_LOG = Path(__file__).resolve().parents[1] / "fixtures/sglang-0.5.23-h200/sparkit-humming/server.log"
QUANT_MODULE = "sglang.srt.layers.quantization.humming"
# Held in a tuple: the hook registry rebinds every module attribute that *is* the original
# function to its wrapper (_propagate_patch), this module's globals included.
_REAL = (weight_module.quantize_weight,)
REAL_QUANTIZE = _REAL[0]


def recorded_error() -> str:
    return next(line for line in FIXTURE_LOG.read_text().splitlines() if line.startswith("TypeError:"))


def cuda_line() -> int:
    """The line of humming's quantize_weight that moves the weight to the GPU."""
    source = Path(weight_module.__file__).read_text()
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "quantize_weight")
    return next(n.lineno for n in ast.walk(fn) if isinstance(n, ast.Attribute) and n.attr == "cuda")


@pytest.fixture
def hooks(monkeypatch):
    """The real HookRegistry, emptied for the test; humming's module attribute restored after."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    saved_hooks = {k: list(v) for k, v in HookRegistry._hooks.items()}
    saved_patched = set(HookRegistry._patched)
    HookRegistry.reset()
    monkeypatch.setattr(plugin, "_STATE", {"target_runner": None, "drafts": [], "notes": []})
    yield HookRegistry
    weight_module.quantize_weight = _REAL[0]
    globals()["REAL_QUANTIZE"] = _REAL[0]
    HookRegistry.reset()
    HookRegistry._hooks.update(saved_hooks)
    HookRegistry._patched.update(saved_patched)


def apply_humming_hook(registry) -> None:
    """HookRegistry.apply_hooks() for the humming target only: the plugin's other targets
    (ModelRunner, the EAGLE workers) do not import on a CPU machine."""
    for target in [t for t in registry._hooks if t != plugin.HUMMING_QUANTIZE_TARGET]:
        del registry._hooks[target]
    registry.apply_hooks()


def sglang_moe_weight_loader():
    """sglang's own HummingMoEMethod weight loader (installed source), bound as SGLang binds it:
    `quantize_weight` comes from its `_lazy_import_humming`, run after the plugin hooks applied."""
    ns = exec_functions(QUANT_MODULE, ["DataType", "HummingMethod", "BaseInputSchema", "BaseWeightSchema",
                                       "HummingInputSchema", "HummingWeightSchema", "quantize_weight",
                                       "_lazy_import_humming"], {})
    ns["_lazy_import_humming"]()
    loader_factory = bind_method(QUANT_MODULE, "HummingMoEMethod", "prepare_weight_loader", {"torch": torch, **ns})
    # The tiny-sglang-humming recipe's SGLANG_HUMMING_ONLINE_QUANT_CONFIG: e2m1 values, e8m0 scales per 32.
    method = types.SimpleNamespace(weight_schema=HummingWeightSchema(b_dtype="float4e2m1", bs_dtype="float8e8m0",
                                                                     weight_scale_group_size=32))
    layer = types.SimpleNamespace(param_dtype=torch.bfloat16)
    return ns, loader_factory(method, layer, weight_loader=None)


def load_one_expert(loader) -> BaseException | None:
    param = types.SimpleNamespace(param_name="weight")
    weight = torch.randn(64, 128, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    try:
        loader(param, weight, weight_name="experts.w13_weight", shard_id="w1", expert_id=0)
    except BaseException as exc:  # noqa: BLE001 - the test inspects what humming raised
        return exc
    return None


def assert_reached_the_gpu_step(exc: BaseException | None) -> None:
    if torch.cuda.is_available():  # a GPU machine: the quantisation itself ran
        assert not isinstance(exc, TypeError), exc
        return
    assert exc is not None, "on a CPU machine humming's quantize_weight cannot finish"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == weight_module.__file__]
    assert frames, f"the error did not come from humming's quantize_weight: {exc!r}"
    assert frames[-1].lineno == cuda_line(), (
        f"humming stopped at line {frames[-1].lineno}, before moving the weight to the GPU: {exc!r}")


def test_sglangs_loader_fails_on_humming_0_1_12_as_recorded_on_the_h200(hooks, monkeypatch):
    monkeypatch.delenv(plugin.HUMMING_KEYWORDS_ENV, raising=False)
    monkeypatch.setenv(plugin.ENABLE_ENV, "1")
    plugin.register()
    apply_humming_hook(hooks)
    ns, loader = sglang_moe_weight_loader()
    assert ns["quantize_weight"] is _REAL[0]
    exc = load_one_expert(loader)
    assert isinstance(exc, TypeError)
    assert f"TypeError: {exc}" == recorded_error()


def test_with_the_plugin_sglangs_loader_gets_through_humming_0_1_12s_checks(hooks, monkeypatch):
    monkeypatch.setenv(plugin.ENABLE_ENV, "1")
    monkeypatch.setenv(plugin.HUMMING_KEYWORDS_ENV, "1")
    plugin.register()
    apply_humming_hook(hooks)  # patches humming.utils.weight.quantize_weight, which sglang then imports
    ns, loader = sglang_moe_weight_loader()
    assert ns["quantize_weight"] is not _REAL[0]
    assert ns["quantize_weight"].__wrapped__ is _REAL[0]
    assert_reached_the_gpu_step(load_one_expert(loader))
    # The activation report carries what the plugin changed (written after the weights load).
    assert plugin._STATE["notes"] == [
        "humming quantize_weight: has_global_scale=False left out, weight_scale_2_type keeps its default "
        "(humming-kernels 0.1.12 renamed the keyword); adapted by the sparkit plugin"]


def sglang_call_keywords() -> dict:
    """The keywords sglang's MoE loader passes to quantize_weight (its installed source), with
    CPU values of the online MXFP4 config."""
    tree = ast.parse(module_path(QUANT_MODULE).read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "quantize_weight"]
    assert len(calls) == 2  # the linear and the MoE loader
    names = {k.arg for k in calls[1].keywords}
    values = {"weight": torch.randn(2, 64, 128, dtype=torch.bfloat16), "dtype": dtypes.float4e2m1,
              "scale_dtype": dtypes.float8e8m0, "group_size": 32, "has_zero_point": False,
              "has_global_scale": False, "is_fp_zero_point": False, "pack": True}
    assert names == set(values), names
    return values


@pytest.mark.parametrize("has_global_scale, passed", [(False, None), (True, "tensor")])
def test_the_adapter_translates_the_keyword_for_the_real_function(has_global_scale, passed):
    kwargs = {**sglang_call_keywords(), "has_global_scale": has_global_scale}
    adapted, changes = plugin.adapt_keywords(REAL_QUANTIZE, plugin.HUMMING_QUANTIZE_TARGET, kwargs)
    assert "has_global_scale" not in adapted
    assert adapted.get("weight_scale_2_type") == passed
    assert len(changes) == 1 and "has_global_scale" in changes[0]
    import inspect

    inspect.signature(REAL_QUANTIZE).bind(**adapted)  # every keyword is one humming takes
    try:
        REAL_QUANTIZE(**adapted)
        exc = None
    except BaseException as error:  # noqa: BLE001
        exc = error
    assert_reached_the_gpu_step(exc)


def test_a_wrong_translation_is_refused_by_humming_before_the_gpu_step():
    """What makes the test above able to fail: humming validates weight_scale_2_type before it
    moves the weight, so a value it does not know stops it earlier."""
    kwargs = {**sglang_call_keywords(), "weight_scale_2_type": "global"}
    del kwargs["has_global_scale"]
    with pytest.raises(AssertionError) as info:
        REAL_QUANTIZE(**kwargs)
    frames = [f for f in traceback.extract_tb(info.value.__traceback__) if f.filename == weight_module.__file__]
    assert frames and frames[-1].lineno < cuda_line()


def test_the_adapter_leaves_a_function_that_still_takes_the_old_keyword_alone():
    """humming 0.1.6-0.1.11 take has_global_scale: nothing is renamed for them."""
    def quantize_weight_0_1_11(weight, dtype, scale_dtype, group_size, group_size_n=None, has_zero_point=False,
                               has_global_scale=False, is_fp_zero_point=False, pack=False):
        return has_global_scale

    kwargs = {"weight": None, "dtype": None, "scale_dtype": None, "group_size": 32, "has_global_scale": True}
    adapted, changes = plugin.adapt_keywords(quantize_weight_0_1_11, plugin.HUMMING_QUANTIZE_TARGET, kwargs)
    assert adapted == kwargs and changes == []


def test_the_hook_is_registered_only_when_the_plan_asks(hooks, monkeypatch):
    from sglang.srt.plugins.hook_registry import HookType

    monkeypatch.setenv(plugin.ENABLE_ENV, "1")
    monkeypatch.delenv(plugin.HUMMING_KEYWORDS_ENV, raising=False)
    plugin.register()
    assert plugin.HUMMING_QUANTIZE_TARGET not in hooks._hooks
    hooks.reset()
    monkeypatch.setenv(plugin.HUMMING_KEYWORDS_ENV, "1")
    plugin.register()
    assert [(t, f) for t, f, _ in hooks._hooks[plugin.HUMMING_QUANTIZE_TARGET]] == [
        (HookType.AROUND, plugin.around_quantize_weight)]


def test_hooking_sglangs_module_global_instead_would_not_reach_the_call():
    """Why the hook target is humming's attribute: sglang's module global is None until its lazy
    import runs, and that import rebinds it to whatever humming.utils.weight holds then."""
    tree = ast.parse(module_path(QUANT_MODULE).read_text())
    top = [n for n in tree.body if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "quantize_weight" for t in n.targets)]
    assert [ast.unparse(n.value) for n in top] == ["None"]
    lazy = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_lazy_import_humming")
    imports = [n for n in ast.walk(lazy) if isinstance(n, ast.ImportFrom) and n.module == "humming.utils.weight"]
    assert [(a.name, a.asname) for n in imports for a in n.names] == [("quantize_weight", "_quantize_weight")]
    assert "quantize_weight" in {name for n in ast.walk(lazy) if isinstance(n, ast.Global) for name in n.names}
    assert sys.modules.get(QUANT_MODULE) is None or sys.modules[QUANT_MODULE].quantize_weight in (None, REAL_QUANTIZE)
