"""One reading of an on/off environment variable: the recipe rules (SGLANG_* switches a recipe
sets), the SGLang adapter and sparkit's plugin (its SPARKIT_* switches) agree on every value, and
on every spelling SGLang's own parser knows they read what SGLang reads."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sparkit.engines.sglang import plugin
from sparkit.env_switch import truthy
from sparkit.planning.rules import check_rules
from sparkit.recipes.load import load_recipe

# Values the two former helpers read differently (rules: anything but ''/0/false/no/off was on;
# the plugin: only 1/true/yes/on), and ones they agreed on.
DISPUTED = ["2", "enabled", "y", "n", "N"]
AGREED = ["1", "true", "YES", " on ", "0", "false", "no", "off", ""]


@pytest.mark.parametrize("value", DISPUTED + AGREED)
def test_the_rules_read_a_switch_as_the_plugin_does(value, monkeypatch):
    """The fp8-head rule fires on SGLANG_ENABLE_FP8_LM_HEAD exactly when the one reading says on,
    and the plugin reads its own switch the same way."""
    loaded = load_recipe("ling-3.0-flash/spark-humming", overrides=[f"server.env={{SGLANG_ENABLE_FP8_LM_HEAD: '{value}'}}"])
    fired = any(v.rule == "fp8-head-excludes-fp32-head" for v in check_rules(loaded))
    monkeypatch.setenv(plugin.ENABLE_ENV, value)
    assert fired == truthy(value) == plugin.enabled()


def test_disputed_values_follow_sglangs_own_reading():
    """'y' and 'n' are SGLang's spellings (sglang.srt.environ.EnvBool); a value it cannot parse
    ('2', 'enabled') falls back to the default, which the former rules helper read as on."""
    assert [truthy(v) for v in DISPUTED] == [False, False, True, False, False]
    assert truthy("2", default=True) and truthy("enabled", default=True)
    assert not truthy("n", default=True) and truthy("y", default=False)


def test_every_spelling_sglang_parses_reads_the_same():
    pytest.importorskip("sglang")
    code = ("import json, sys; from sglang.srt.environ import EnvBool\n"
            "out = {}\n"
            "for v in json.loads(sys.argv[1]):\n"
            "    try: out[v] = EnvBool(False).parse(v)\n"
            "    except ValueError: out[v] = None\n"
            "print(json.dumps(out))")
    import json

    values = ["1", "true", "True", "yes", "y", "Y", "0", "false", "no", "n", "2", "enabled", "on", "off"]
    done = subprocess.run([sys.executable, "-c", code, json.dumps(values)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    sglang_reads = json.loads(done.stdout)
    for value, parsed in sglang_reads.items():
        if parsed is None:  # SGLang warns and keeps the default
            assert truthy(value, default=False) is (value in ("on",)), value
            assert truthy(value, default=True) is (value not in ("off",)), value
        else:
            assert truthy(value) is parsed, value


def test_the_plugin_still_imports_only_the_standard_library_and_its_switch():
    """Inside SGLang's process the plugin loads before anything else of sparkit: only its switch
    and the re-scoring rule's numbers (both standard library only), never torch or the adapters."""
    code = ("import sys; before = set(sys.modules); import sparkit.engines.sglang.plugin; "
            "print(sorted(m for m in set(sys.modules) - before if m.startswith('sparkit')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sorted(["sparkit", "sparkit._version", "sparkit.engines", "sparkit.engines.sglang",
                                              "sparkit.engines.sglang.plugin", "sparkit.env_switch",
                                              "sparkit.kernels", "sparkit.kernels.rescoring"]))
