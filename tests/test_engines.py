"""The engine registry: engines are entry points of `sparkit.engines`, the built-ins included, and a
third-party engine registered there is a recipe's `engine:` like the built-ins."""

from __future__ import annotations

import sys
import textwrap
from importlib import metadata

import pytest

from sparkit import contract
from sparkit.engines import base
from sparkit.engines.sglang import plugin
from sparkit.errors import RecipeError
from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import load_recipe


def test_installed_entry_points_are_the_builtin_table():
    installed = {ep.name: ep.value for ep in metadata.entry_points(group=contract.ENTRY_POINT_GROUP)}
    assert installed == contract.BUILTIN_ENGINES


def test_sglang_plugin_entry_point_is_the_one_the_adapter_names():
    eps = {ep.name: ep.value for ep in metadata.entry_points(group="sglang.srt.plugins")}
    assert eps[plugin.PLUGIN_NAME] == plugin.PLUGIN_ENTRY_POINT


def test_every_adapter_states_its_seam():
    for name, adapter in base.registry().items():
        assert adapter.name == name
        assert isinstance(adapter.needs_gpu, bool) and adapter.packages and adapter.install_hint
        info = adapter.probe()
        assert info.name == name


@pytest.fixture
def third_party_engine(tmp_path, monkeypatch):
    """A package outside sparkit that registers an engine through the entry-point group, as a pip
    install would (a dist-info with entry_points.txt on sys.path)."""
    src = tmp_path / "site"
    (src / "echo_engine").mkdir(parents=True)
    (src / "echo_engine" / "__init__.py").write_text(textwrap.dedent('''
        import sys
        from sparkit.contract import EngineInfo, EngineLaunch
        from sparkit.engines.sglang.log import SGLangLogAdapter

        class EchoAdapter(SGLangLogAdapter):
            name = "echo"
            needs_gpu = False
            packages = ("json",)
            install_hint = "pip install echo-engine"
            validation_hint = ""
            secret_files = ()

            def probe(self):
                return EngineInfo("echo", True, "1.0")

            def rules(self):
                return []

            def launch(self, loaded, *, port):
                return EngineLaunch(argv=[sys.executable, "-m", "echo_engine", "--port", str(port)], env={},
                                    served_model_name="echo", expectations={"server_args": {}},
                                    validated_by="echo's parser")

            def preflight(self, plan):
                return []

            def deliver_secret(self, secret, run_dir):
                return {"ECHO_KEY": secret}, []

            def prepare(self, plan, progress):
                pass
    '''))
    dist = src / "echo_engine-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-engine\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[sparkit.engines]\necho = echo_engine:EchoAdapter\n")
    monkeypatch.syspath_prepend(str(src))
    base.registry.cache_clear()
    yield
    sys.modules.pop("echo_engine", None)
    base.registry.cache_clear()


def test_a_third_party_engine_compiles_like_a_builtin(third_party_engine, tmp_path):
    assert "echo" in contract.engine_names()
    recipe = tmp_path / "echo.yaml"
    recipe.write_text("engine: echo\nmodel:\n  path: sparkit:tiny-ling\nstack:\n  moe_backend: humming\n")
    plan = compile_plan(load_recipe(str(recipe)), port=8123)
    assert plan.engine == "echo" and plan.argv[1:] == ["-m", "echo_engine", "--port", "8123"]
    assert plan.validated_by == "echo's parser"
    # The embedded engine's own rule (no humming there) is not the echo engine's.
    assert plan.expectations.moe_backend == "humming"


def test_an_unregistered_engine_is_a_recipe_error_naming_the_registered_ones(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("engine: vllm\nmodel:\n  path: x/y\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(str(recipe))
    message = str(info.value)
    assert "engine" in (info.value.key or "") and "vllm" in message
    assert "embedded" in message and "sglang" in message and info.value.line == 1
