"""The compatibility judgement on the installed sglang 0.5.23 wheel's source (sparkit.engines.sglang.compat).

sglang is installed --no-deps and humming-kernels 0.1.12 (sglang's own pin) beside it, so the
sglang -> humming pair is judged on both real sources: the keyword mismatch of the H200 run is
found by reading them. sgl_kernel and flashinfer are GPU libraries absent here: their pairs are
judged against provider trees written for the test (the one boundary where a stand-in is allowed),
always against sglang's real source.
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest

from _sglang_source import module_path

pytest.importorskip("sglang")

from sparkit.engines.sglang import compat, plugin  # noqa: E402
from sparkit.installed_source import locate  # noqa: E402

HUMMING = locate("humming")
needs_humming = pytest.mark.skipif(HUMMING is None, reason="scripts/test installs humming-kernels (--no-deps)")
ONLINE = next(n for n in compat.all_needs() if n.name == "humming-online")
SGL_KERNEL = compat.SGL_KERNEL
TORCH_ABI = compat.TORCH_ABI
# What the H200 printed when sgl_kernel 0.4.10 was imported under torch 2.11 (../shared/gpu/sglang-h200/README.md).
H200_ABI_ERROR = ("ImportError: /tmp/site/sgl_kernel/sm90/common_ops.abi3.so: undefined symbol: "
                  "_ZN3c104cuda19CUDAErrorLogCaptureC1Ev")


def quantize_weight_calls() -> list[int]:
    """Lines of sglang's humming.py that call quantize_weight with has_global_scale=, read here
    independently of the code under test."""
    tree = ast.parse(module_path("sglang.srt.layers.quantization.humming").read_text())
    return sorted(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                  and n.func.id == "quantize_weight" and any(k.arg == "has_global_scale" for k in n.keywords))


def humming_copy(tmp_path: Path, edit=None) -> list[str]:
    """The installed humming (source and metadata) copied under tmp_path, `edit(weight_py_text)`
    applied to humming/utils/weight.py; returns a search path that finds it first."""
    root = tmp_path / "site"
    shutil.copytree(HUMMING.root, root / "humming", ignore=shutil.ignore_patterns("_native", "*.so", "__pycache__"))
    for info in HUMMING.root.parent.glob("humming_kernels-*.dist-info"):
        shutil.copytree(info, root / info.name)
    weight = root / "humming/utils/weight.py"
    if edit is not None:
        weight.write_text(edit(weight.read_text()))
    return [str(root), *sys.path]


@needs_humming
def test_the_keyword_mismatch_is_found_by_reading_both_installed_sources():
    finding = compat.judge(needs=[ONLINE]).findings[0]
    assert finding.status == compat.PLUGIN
    assert finding.pair == "sglang 0.5.23 -> humming-kernels 0.1.12"
    assert finding.fix_kind == "plugin"
    assert finding.plugin_env == {plugin.ENABLE_ENV: "1", plugin.HUMMING_KEYWORDS_ENV: "1"}
    lines = quantize_weight_calls()
    assert len(lines) == 2  # the linear and the MoE loader
    for line, evidence in zip(lines, finding.evidence):
        assert evidence.startswith(f"sglang/srt/layers/quantization/humming.py:{line} passes has_global_scale= to "
                                   "humming.utils.weight.quantize_weight")
        assert "weight_scale_2_type" in evidence  # what the installed function takes instead
    # The plugin's hook target is the function sglang's calls reach.
    assert "humming.utils.weight.quantize_weight" == plugin.HUMMING_QUANTIZE_TARGET


@needs_humming
def test_a_humming_that_takes_has_global_scale_is_compatible(tmp_path):
    """humming 0.1.6-0.1.11's signature (the installed source, keyword renamed back): nothing to fix."""
    path = humming_copy(tmp_path, lambda text: text.replace("weight_scale_2_type: str | None = None,",
                                                            "has_global_scale: bool = False,", 1))
    finding = compat.judge(needs=[ONLINE], stack=compat.Stack.detect(path)).findings[0]
    assert finding.status == compat.OK, finding


@needs_humming
def test_a_keyword_the_plugin_does_not_adapt_fails_with_a_recipe_change(tmp_path):
    path = humming_copy(tmp_path, lambda text: text.replace("    has_zero_point: bool = False,\n",
                                                            "    zero_point: bool = False,\n", 1))
    finding = compat.judge(needs=[ONLINE], stack=compat.Stack.detect(path)).findings[0]
    assert finding.status == compat.FAIL
    assert any("passes has_zero_point= to humming.utils.weight.quantize_weight" in e for e in finding.evidence)
    # sglang's own pin is what is installed: no version to move to, so the recipe changes.
    assert finding.fix_kind == "recipe" and "stack.quantization" in finding.fix and "==0.1.12" in finding.fix


@needs_humming
def test_a_name_sglang_imports_that_humming_lacks_fails(tmp_path):
    path = humming_copy(tmp_path, lambda text: text.replace("def quantize_weight(", "def quantise_weight(", 1))
    finding = compat.judge(needs=[ONLINE], stack=compat.Stack.detect(path)).findings[0]
    assert finding.status == compat.FAIL
    assert any("imports humming.utils.weight.quantize_weight (required): not in humming-kernels 0.1.12" in e
               for e in finding.evidence), finding.evidence


# ------------------------------------------------------------------ GPU libraries absent here


def sglang_imports_of(provider: str, modules) -> dict[str, set[str]]:
    """provider module -> names, of every `from provider... import` and LazyImport("provider...",
    name) in the modules' installed source (any platform), read with a plain ast walk."""
    out: dict[str, set[str]] = {}
    sg = locate("sglang")
    for module in modules:
        base = sg.root.joinpath(*module.split(".")[1:])
        files = sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
        for path in files:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == provider:
                    out.setdefault(node.module, set()).update(a.name for a in node.names)
                if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "LazyImport"
                        and str(getattr(node.args[0], "value", "")).split(".")[0] == provider):
                    out.setdefault(node.args[0].value, set()).add(node.args[1].value)
    return out


def fake_provider(root: Path, provider: str, names: dict[str, set[str]], version: str, requires: str = "",
                  drop: str | None = None, init_raises: str | None = None) -> list[str]:
    """A provider package at root with a function for every imported name (less `drop`), and a
    dist-info declaring its version and requirements."""
    for module, wanted in names.items():
        parts = module.split(".")
        target = root.joinpath(*parts) / "__init__.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        body = "".join(f"def {n}(*args, **kwargs):\n    pass\n" for n in sorted(wanted) if n != drop)
        if module == provider and init_raises:
            body = f"raise ImportError({init_raises!r})\n" + body
        target.write_text(target.read_text() + body if target.exists() else body)
    dist = {"sgl_kernel": "sglang_kernel", "flashinfer": "flashinfer_python"}[provider]
    info = root / f"{dist}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n"
                                   + (f"Requires-Dist: {requires}\n" if requires else ""))
    return [str(root), *sys.path]


def sgl_kernel_names():
    return sglang_imports_of("sgl_kernel", SGL_KERNEL.modules)


def test_sgl_kernel_with_every_name_sglang_imports_is_compatible(tmp_path):
    path = fake_provider(tmp_path, "sgl_kernel", sgl_kernel_names(), "0.4.10")
    finding = compat.judge(needs=[SGL_KERNEL], stack=compat.Stack.detect(path)).findings[0]
    assert finding.status == compat.OK, finding
    assert finding.pair == "sglang 0.5.23 -> sglang-kernel 0.4.10"


@pytest.mark.slow
def test_a_kernel_the_cuda_path_imports_missing_from_sgl_kernel_fails_naming_where(tmp_path):
    path = fake_provider(tmp_path, "sgl_kernel", sgl_kernel_names(), "0.4.9", drop="silu_and_mul")
    finding = compat.judge(needs=[SGL_KERNEL], stack=compat.Stack.detect(path)).findings[0]
    assert finding.status == compat.FAIL
    assert finding.pair == "sglang 0.5.23 -> sglang-kernel 0.4.9"
    assert any(e.startswith("sglang/srt/layers/activation.py:") and "sgl_kernel.silu_and_mul (required)" in e
               for e in finding.evidence), finding.evidence
    # sglang declares the version it was built with: install that one
    assert finding.fix_kind == "install" and finding.fix.startswith("pip install 'sglang-kernel==0.4.10'")


def test_a_kernel_only_another_platform_imports_is_not_needed(tmp_path):
    """sglang's activation.py imports gelu_quick from sgl_kernel only under `elif _is_hip`."""
    names = sgl_kernel_names()
    source = module_path("sglang.srt.layers.activation").read_text()
    assert "gelu_quick" in names["sgl_kernel"] and "elif _is_hip:\n    from sgl_kernel import gelu_and_mul, gelu_quick" in source
    path = fake_provider(tmp_path, "sgl_kernel", names, "0.4.10", drop="gelu_quick")
    assert compat.judge(needs=[SGL_KERNEL], stack=compat.Stack.detect(path)).findings[0].status == compat.OK


def test_sgl_kernel_built_for_another_torch_fails_when_its_import_says_so(tmp_path):
    path = fake_provider(tmp_path, "sgl_kernel", sgl_kernel_names(), "0.4.10", requires="torch==2.14.1",
                         init_raises=H200_ABI_ERROR.split(": ", 1)[1])
    stack = compat.Stack.detect(path)
    declared = compat.judge(needs=[TORCH_ABI], stack=stack).findings[0]
    torch_version = stack["torch"].version
    assert declared.status == compat.WARN and f"torch {torch_version} is installed" in declared.detail
    probed = compat.judge(needs=[TORCH_ABI], stack=stack, probe=True).findings[0]
    assert probed.status == compat.FAIL and "undefined symbol" in probed.detail
    assert probed.pair == f"sglang-kernel 0.4.10 -> torch {torch_version}"
    assert probed.fix == "pip install 'torch==2.14.1' (the torch sglang-kernel 0.4.10 was built for)"
    assert any("_ZN3c104cuda19CUDAErrorLogCaptureC1Ev" in e for e in probed.evidence)


def test_sgl_kernel_that_loads_passes_the_probe(tmp_path):
    path = fake_provider(tmp_path, "sgl_kernel", sgl_kernel_names(), "0.4.10", requires="torch==2.14.1")
    probed = compat.judge(needs=[TORCH_ABI], stack=compat.Stack.detect(path), probe=True).findings[0]
    assert probed.status == compat.OK and "import sgl_kernel in a child process: ok" in probed.evidence


def test_speculative_decoding_without_flashinfer_warns_about_sampled_requests():
    """Seen on the H200: SGLang 0.5.23's NEXTN verify imports flashinfer for temperature > 0."""
    needs = compat.needs_for({"stack": {"speculative": {"method": "nextn"}}})
    sampling = next(n for n in needs if n.name == "flashinfer-sampling")
    assert locate("flashinfer") is None  # not installed in the test environment
    finding = compat.judge(needs=[sampling]).findings[0]
    assert finding.status == compat.WARN and "temperature > 0" in finding.detail and "greedy" in finding.fix
    assert not any(n.name == "flashinfer-sampling" for n in compat.needs_for({"stack": {"speculative": {"method": "none"}}}))


def test_flashinfer_sampling_found_where_sglang_looks_for_it(tmp_path):
    """sglang binds flashinfer's renorm kernels through LazyImport("flashinfer.sampling", name)."""
    names = sglang_imports_of("flashinfer", ("sglang.srt.layers.sampler", "sglang.kernels.ops.sampling.renorm"))
    assert {"top_k_renorm_probs", "top_p_renorm_probs"} <= names["flashinfer.sampling"]
    sampling = next(n for n in compat.all_needs() if n.name == "flashinfer-sampling")
    ok = fake_provider(tmp_path / "a", "flashinfer", names, "0.7.2")
    assert compat.judge(needs=[sampling], stack=compat.Stack.detect(ok)).findings[0].status == compat.OK
    names["flashinfer.sampling"].discard("top_p_renorm_probs")
    gone = fake_provider(tmp_path / "b", "flashinfer", names, "0.7.2")
    finding = compat.judge(needs=[sampling], stack=compat.Stack.detect(gone)).findings[0]
    assert finding.status == compat.FAIL and any("flashinfer.sampling.top_p_renorm_probs" in e for e in finding.evidence)


def test_the_recipes_needs_follow_their_stack():
    def names(stack):
        return [n.name for n in compat.needs_for({"stack": stack})]

    assert names({"moe_backend": "triton", "lm_head": "bf16"}) == ["sgl-kernel", "torch-abi"]
    assert "humming-online" in names({"quantization": "humming", "moe_backend": "humming"})
    assert "humming-moe" in names({"moe_backend": "humming"}) and "humming-online" not in names({"moe_backend": "humming"})
    assert "flashinfer-moe-flashinfer_mxfp4" in names({"moe_backend": "flashinfer_mxfp4", "lm_head": "fp32"})
    assert "triton-fp8-head" in names({"lm_head": "fp8"})
    every = {n.name for n in compat.all_needs()}
    assert set(names({"quantization": "humming", "moe_backend": "humming", "lm_head": "fp8",
                      "speculative": {"method": "nextn"}})) <= every


# ------------------------------------------------------------------ the plan, the preflight, doctor


def plan_of(recipe: str, *sets: str):
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    return compile_plan(load_recipe(recipe, list(sets)))


@needs_humming
def test_the_plan_enables_the_plugins_fix_and_says_so():
    plan = plan_of("tiny/tiny-sglang-humming", "stack.lm_head=bf16", "stack.speculative=none")
    assert plan.env[plugin.ENABLE_ENV] == "1" and plan.env[plugin.HUMMING_KEYWORDS_ENV] == "1"
    assert plan.env[plugin.PLUGINS_ENV] == "sparkit"
    assert plan.env[plugin.FP8_ENV] == "0"  # the plugin is on for the fix only: the bf16 head stays bf16
    (provision,) = [p for p in plan.provisions if p.optimisation == "humming_keywords=adapted"]
    assert provision.provider == "sparkit-plugin"
    assert provision.detail.startswith("sglang 0.5.23 -> humming-kernels 0.1.12: ") and "has_global_scale" in provision.detail
    # with the FP8 head the plugin is on anyway, and converts the head
    full = plan_of("tiny/tiny-sglang-humming")
    assert full.env[plugin.HUMMING_KEYWORDS_ENV] == "1" and plugin.FP8_ENV not in full.env


def test_a_recipe_without_humming_quantization_gets_no_keyword_adapter():
    plan = plan_of("tiny/tiny-sglang-baseline")
    assert plugin.HUMMING_KEYWORDS_ENV not in plan.env and plugin.ENABLE_ENV not in plan.env
    assert not any(p.optimisation == "humming_keywords=adapted" for p in plan.provisions)


@needs_humming
def test_a_humming_that_needs_no_fix_gets_no_adapter(tmp_path, monkeypatch):
    path = humming_copy(tmp_path, lambda text: text.replace("weight_scale_2_type: str | None = None,",
                                                            "has_global_scale: bool = False,", 1))
    monkeypatch.syspath_prepend(path[0])
    plan = plan_of("tiny/tiny-sglang-humming", "stack.lm_head=bf16")
    assert plugin.HUMMING_KEYWORDS_ENV not in plan.env
    assert not any(p.optimisation == "humming_keywords=adapted" for p in plan.provisions)
    # the plugin is on only to report the recipe's SGLANG_HUMMING_ONLINE_QUANT_CONFIG (check_engine_switches)
    assert plan.env[plugin.FP8_ENV] == "0"
    assert [p.optimisation for p in plan.provisions if p.provider == "sparkit-plugin"] == ["engine_switches=reported"]


@needs_humming
def test_preflight_checks_each_pair_and_the_plugin_fix_passes_only_when_planned():
    from sparkit.engines.sglang.adapter import SGLangAdapter

    plan = plan_of("tiny/tiny-sglang-humming")
    checks = {c.name: c for c in SGLangAdapter().preflight(plan)}
    online = checks["compat:humming-online"]
    assert online.title == "sglang 0.5.23 -> humming-kernels 0.1.12"
    assert online.status.value == "pass" and online.detail.endswith("(enabled by this plan)")
    plan.env.pop(plugin.HUMMING_KEYWORDS_ENV)  # a plan compiled where the fix was not known
    online = {c.name: c for c in SGLangAdapter().preflight(plan)}["compat:humming-online"]
    assert online.status.value == "fail" and f"server.env.{plugin.HUMMING_KEYWORDS_ENV}=1" in online.fix


def test_a_recipe_the_installed_stack_cannot_run_fails_preflight_with_exit_4_naming_the_pair(tmp_path, monkeypatch):
    from sparkit.errors import PreflightError
    from sparkit.runs.pipeline import preflight

    names = sgl_kernel_names()
    fake_provider(tmp_path, "sgl_kernel", names, "0.4.9", drop="rmsnorm")
    monkeypatch.syspath_prepend(str(tmp_path))
    plan = plan_of("tiny/tiny-sglang-baseline", "target=auto")
    with pytest.raises(PreflightError) as info:
        preflight(plan)
    assert info.value.exit_code == 4
    assert "sglang 0.5.23 -> sglang-kernel 0.4.9: every SGLang model on CUDA" in info.value.message
    results = {r.name: r for r in info.value.results}
    assert any("sgl_kernel.rmsnorm (required)" in e for e in results["compat:sgl-kernel"].evidence)


@needs_humming
def test_doctor_json_carries_the_judgement(tmp_path):
    import json
    import os
    import subprocess

    env = {**os.environ, "SPARKIT_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "sparkit.cli.main", "doctor", "--json"], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)["compatibility"]["sglang"]
    assert doc["installed"]["sglang"]["version"] == "0.5.23"
    assert doc["installed"]["humming-kernels"]["version"] == "0.1.12"
    findings = {f["need"]: f for f in doc["findings"]}
    assert findings["humming-online"]["status"] == "plugin"
    assert findings["sgl-kernel"]["status"] == "fail"  # not installed in the test environment
    verdicts = {r["recipe"]: r for r in doc["recipes"]}
    assert verdicts["tiny/tiny-sglang-humming"]["plugin"] == ["sglang 0.5.23 -> humming-kernels 0.1.12"]
    assert "sglang 0.5.23 -> sglang-kernel not installed" in verdicts["tiny/tiny-sglang"]["failed"]


@needs_humming
def test_a_recipe_that_turns_the_fix_off_is_warned_and_fails_preflight():
    from sparkit.engines.sglang.adapter import SGLangAdapter

    plan = plan_of("tiny/tiny-sglang-humming", f"server.env.{plugin.HUMMING_KEYWORDS_ENV}=0")
    assert plan.env[plugin.HUMMING_KEYWORDS_ENV] == "0"
    assert any(w.startswith(f"server.env.{plugin.HUMMING_KEYWORDS_ENV}=0 turns off the plugin's fix") for w in plan.warnings)
    online = {c.name: c for c in SGLangAdapter().preflight(plan)}["compat:humming-online"]
    assert online.status.value == "fail"


def test_where_humming_is_not_installed_the_plan_enables_the_adapter_in_case(monkeypatch):
    """A plan made on a machine without humming (the import system finds none: the GPU library is
    absent) cannot tell; the adapter renames only a keyword the wrapped function does not take."""
    import importlib.machinery

    real = importlib.machinery.PathFinder.find_spec

    def find_spec(name, path=None, target=None):
        return None if name == "humming" else real(name, path, target)

    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec", find_spec)
    assert locate("humming") is None
    plan = plan_of("tiny/tiny-sglang-humming", "stack.lm_head=bf16")
    assert plan.env[plugin.HUMMING_KEYWORDS_ENV] == "1" and plan.env[plugin.FP8_ENV] == "0"
    (provision,) = [p for p in plan.provisions if p.optimisation == "humming_keywords=adapted"]
    assert "cannot be judged here (humming-kernels is not installed)" in provision.detail


def test_a_path_whose_modules_this_sglang_lacks_is_not_judged_ok(tmp_path):
    """The map of modules per path is sglang 0.5.23's: on a version without them the judgement
    says it cannot tell rather than passing on nothing read."""
    need = compat.Need("moved", "a path sglang moved", "sglang", "sgl_kernel", ("sglang.srt.layers.no_such_module",))
    path = fake_provider(tmp_path, "sgl_kernel", sgl_kernel_names(), "0.4.10")
    finding = compat.judge(needs=[need], stack=compat.Stack.detect(path)).findings[0]
    assert finding.status == compat.UNKNOWN and "sglang.srt.layers.no_such_module" in finding.detail


@needs_humming
def test_the_plugins_translation_must_be_a_value_humming_admits(tmp_path):
    """humming 0.1.12 asserts weight_scale_2_type in [None, "none", "tensor", "channel"]; a
    humming that no longer admits "tensor" is not fixed by the plugin."""
    from sparkit.installed_source import accepted_values, resolve

    real = resolve(HUMMING, "humming.utils.weight", "quantize_weight")
    assert accepted_values(real, "weight_scale_2_type") == {None, "none", "tensor", "channel"}
    path = humming_copy(tmp_path, lambda text: text.replace('[None, "none", "tensor", "channel"]',
                                                            '[None, "none", "channel"]', 1))
    finding = compat.judge(needs=[ONLINE], stack=compat.Stack.detect(path)).findings[0]
    assert finding.status == compat.FAIL
    assert any("the plugin would pass weight_scale_2_type='tensor', which it does not admit" in e
               for e in finding.evidence), finding.evidence


def test_dspark_gets_triton_for_the_draft_where_sgl_kernel_has_no_fa3(tmp_path):
    """The H200 kit's trimmed sgl_kernel (no flash_ops.abi3.so): SGLang's DSpark draft runner dies
    importing FA3 unless both backends are named; sparkit names triton for both and says why."""
    path = fake_provider(tmp_path, "sgl_kernel", sgl_kernel_names(), "0.4.10")
    pick = compat.dspark_attention_backends(compat.Stack.detect(path))
    assert (pick.target, pick.draft, pick.runs) == ("triton", "triton", True)
    assert "has no FA3 (flash_ops*.so absent" in pick.reason
    assert compat.dspark_attention_backends(compat.Stack.detect(path), recipe_backend="trtllm_mla").target == "trtllm_mla"


def test_dspark_keeps_sglangs_backends_where_sgl_kernel_has_fa3(tmp_path):
    path = fake_provider(tmp_path, "sgl_kernel", sgl_kernel_names(), "0.4.10")
    (tmp_path / "sgl_kernel" / "flash_ops.abi3.so").write_bytes(b"")
    pick = compat.dspark_attention_backends(compat.Stack.detect(path))
    assert (pick.target, pick.draft) == (None, None) and "has FA3" in pick.reason


def test_where_sgl_kernel_is_not_installed_dspark_plans_sglangs_choice_and_says_why(monkeypatch):
    """Planning on a machine without sgl_kernel (this one) leaves the backends to SGLang: the
    serving host's plan decides (what `sparkit up` compiles there)."""
    assert locate("sgl_kernel") is None
    pick = compat.dspark_attention_backends()
    assert (pick.target, pick.draft) == (None, None) and "cannot be told" in pick.reason
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    plan = compile_plan(load_recipe("ling-3.0-flash/tp4-dspark"))
    assert "--speculative-draft-attention-backend" not in plan.argv
    assert any(p.optimisation == "draft_attention=sglang-default" and "cannot be told" in p.detail for p in plan.provisions)


def test_a_dspark_plan_on_a_host_without_fa3_passes_triton_for_both(tmp_path, monkeypatch):
    path = fake_provider(tmp_path, "sgl_kernel", sgl_kernel_names(), "0.4.10")
    real_detect = compat.Stack.detect
    monkeypatch.setattr(compat.Stack, "detect", classmethod(lambda cls, search_path=None: real_detect(path)))
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    plan = compile_plan(load_recipe("ling-3.0-flash/tp4-dspark", ["stack.attention_backend=null"]))
    args = plan.argv
    assert args[args.index("--attention-backend") + 1] == "triton"
    assert args[args.index("--speculative-draft-attention-backend") + 1] == "triton"
    assert plan.expectations.server_args["speculative_draft_attention_backend"] == "triton"
