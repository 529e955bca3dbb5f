"""sglang's parser answers, remembered per install (sparkit.engines.sglang.parser_facts): a plan
made from the record is the plan the real parser makes, a refusal reads the same, and the record
is never used for another sglang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkit.engines.sglang import adapter, parser_facts

pytest.importorskip("sglang.srt.server_args")

# Runs a sparkit command, then says on the last stderr line whether sglang's parser was imported.
_REPORTING = """
import sys
from sparkit.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
sys.stderr.write("\\nimported-server-args=%s\\n" % ("sglang.srt.server_args" in sys.modules))
sys.exit(code)
"""


def sparkit(home: Path, *args: str) -> tuple[subprocess.CompletedProcess, bool]:
    env = {**os.environ, "SPARKIT_HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", _REPORTING, *args], capture_output=True, text=True, env=env, timeout=600)
    imported = done.stderr.rstrip().rsplit("\n", 1)[-1] == "imported-server-args=True"
    return done, imported


def without_validation_note(plan: dict) -> dict:
    return {k: v for k, v in plan.items() if k != "validated_by"}


@pytest.mark.slow
def test_a_second_plan_is_answered_from_the_record_without_importing_sglang(tmp_path):
    first, imported_first = sparkit(tmp_path, "plan", "ling-3.0-flash/tp4-nextn", "--json")
    second, imported_second = sparkit(tmp_path, "plan", "ling-3.0-flash/tp4-nextn", "--json")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert imported_first and not imported_second
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert without_validation_note(a) == without_validation_note(b)  # warnings (an ignored SGLANG_ env) included
    assert "remembered" in b["validated_by"] and "remembered" not in a["validated_by"]
    assert a["warnings"] and a["warnings"] == b["warnings"]
    records = list((tmp_path / "cache" / "sglang-parser").glob("*.json"))
    assert len(records) == 1 and oct(records[0].stat().st_mode & 0o777) == "0o600"


@pytest.mark.slow
def test_a_flag_sglang_refuses_reads_the_same_from_the_record(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  path: org/model\nserver:\n  extra_args: ['--max-total-tokens', 'eight']\n")
    first, _ = sparkit(tmp_path, "plan", str(recipe))
    second, imported = sparkit(tmp_path, "plan", str(recipe))
    assert first.returncode == second.returncode == 3
    assert "Invalid integer value: 'eight'" in first.stderr
    message = [line for line in first.stderr.splitlines() if line.startswith("error:")]
    assert message == [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert not imported


def test_the_record_answers_as_the_real_parser_for_every_shipped_sglang_recipe(sparkit_home, monkeypatch):
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe, shipped_recipes

    def plans():
        adapter.parser_facts.cache_clear()
        out = {}
        for name, path in shipped_recipes():
            loaded = load_recipe(path)
            if loaded.recipe.engine == "sglang":
                plan = compile_plan(loaded, port=31234)
                out[name] = (plan.argv, plan.env, plan.warnings, [p.__dict__ for p in plan.provisions])
        return out, adapter.parser_facts().remembered

    learnt, remembered_first = plans()
    recalled, remembered_second = plans()
    assert not remembered_first and remembered_second
    assert len(learnt) >= 10 and learnt == recalled
    adapter.parser_facts.cache_clear()


def test_another_port_reuses_the_verdict(sparkit_home):
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    adapter.parser_facts.cache_clear()
    compile_plan(load_recipe("ling-3.0-flash/spark-optimized"), port=40001)
    count = len(adapter.parser_facts().verdicts)
    plan = compile_plan(load_recipe("ling-3.0-flash/spark-optimized"), port=40002)
    assert len(adapter.parser_facts().verdicts) == count and "40002" in plan.argv
    adapter.parser_facts.cache_clear()


def fake_sglang(root: Path, server_args: str, monkeypatch) -> None:
    (root / "srt").mkdir(parents=True, exist_ok=True)
    (root / "srt" / "server_args.py").write_text(server_args)
    (root / "srt" / "environ.py").write_text("class Envs: pass\n")

    class Spec:
        submodule_search_locations = [str(root)]

    monkeypatch.setattr(parser_facts.importlib.util, "find_spec", lambda name: Spec() if name == "sglang" else None)


def test_the_record_is_keyed_on_the_installed_sglangs_own_files(tmp_path, monkeypatch):
    fake_sglang(tmp_path / "a", "# one parser\n", monkeypatch)
    one, _, missing = parser_facts.install_key()
    assert one is not None and missing is None
    fake_sglang(tmp_path / "a", "# one parser, edited\n", monkeypatch)
    edited, _, _ = parser_facts.install_key()
    fake_sglang(tmp_path / "b", "# one parser\n", monkeypatch)
    elsewhere, _, _ = parser_facts.install_key()
    assert len({one, edited, elsewhere}) == 3
    fake_sglang(tmp_path / "a", "# one parser\n", monkeypatch)
    assert parser_facts.install_key()[0] == one


def test_no_record_is_used_when_sglang_does_not_import(sparkit_home, monkeypatch):
    def refuse(name):
        raise ModuleNotFoundError("No module named 'sglang'", name="sglang")

    monkeypatch.setattr(parser_facts.importlib.util, "find_spec", refuse)
    facts = parser_facts.load_facts()
    assert facts.unavailable == "ModuleNotFoundError: No module named 'sglang'" and not facts.options


def test_an_unreadable_record_is_rebuilt_from_the_real_parser(sparkit_home):
    key, _, _ = parser_facts.install_key()
    path = parser_facts.record_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    facts = parser_facts.load_facts()
    assert not facts.remembered and "--tp-size" in facts.options and facts.unavailable is None
    facts.check(["--model-path", "x"])
    facts.save()
    assert parser_facts.load_facts().remembered


@pytest.mark.slow
def test_a_recipe_never_planned_reuses_what_another_taught(tmp_path):
    """The verdicts were kept per command line, so every new recipe paid SGLang's import again
    (26-38 s at load); the replica of the parser answers a new one (issue 39 item 5)."""
    first, imported_first = sparkit(tmp_path, "plan", "ling-3.0-flash/tp4-nextn", "--json")
    other, imported_other = sparkit(tmp_path, "plan", "ling-3.0-flash/spark-optimized", "--json")
    assert first.returncode == 0 and other.returncode == 0, first.stderr + other.stderr
    assert imported_first and "note: importing sglang 0.5.23 to ask its argument parser" in first.stderr
    assert not imported_other and "note: importing sglang" not in other.stderr
    fresh, imported_fresh = sparkit(tmp_path / "fresh", "plan", "ling-3.0-flash/spark-optimized", "--json")
    assert imported_fresh
    assert without_validation_note(json.loads(other.stdout)) == without_validation_note(json.loads(fresh.stdout))


def argv_variants(argv: list[str]) -> list[list[str]]:
    """A shipped recipe's argv and ways a user can get it wrong or right: an unknown flag, a bad
    int and float, a bad choice, an ambiguous abbreviation, a value sglang's own types convert."""
    return [argv, argv + ["--bogus-flag"], argv + ["--tp-size", "two"], argv + ["--mem-fraction-static", "0.5x"],
            argv + ["--attention-backend", "nope"], argv + ["--cuda-graph-max-bs", "8"], argv + ["--moe-runner"],
            argv + ["--context-length", "8k"], argv + ["--context-length", "eight"], argv + ["--disable-cuda-graph"],
            argv + ["--json-model-override-args", "{not json"], argv + ["--port"]]


def test_the_replica_gives_the_real_parsers_verdict_and_message(sparkit_home):
    """Every answer the replica gives is the real parser's, word for word; where only sglang's own
    code can judge a value it does not answer (and the real parser does)."""
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe, shipped_recipes

    adapter.parser_facts.cache_clear()
    facts = adapter.parser_facts()  # learnt from the real parser: the replica's rows
    real = facts.real_parser()
    argvs = [compile_plan(load_recipe(path), port=31234).argv[3:] for _, path in shipped_recipes()
             if load_recipe(path).recipe.engine == "sglang"]
    replayed = deferred = 0
    for argv in {json.dumps(v): v for a in argvs for v in argv_variants(a)}.values():
        try:
            real.parse_args(argv)
            truth = None
        except parser_facts.ParserRejected as exc:
            truth = str(exc)
        answer = facts._replayed(argv)
        if answer is parser_facts._NOT_REPLAYED:
            deferred += 1
        else:
            replayed += 1
            assert answer == truth, argv
    assert replayed > 2 * deferred > 0  # 4 of the 12 variants use an option of sglang's own type or action
    adapter.parser_facts.cache_clear()


def test_a_value_only_sglangs_code_can_judge_asks_the_real_parser_once(sparkit_home):
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    adapter.parser_facts.cache_clear()
    facts = adapter.parser_facts()
    argv = compile_plan(load_recipe("tiny/tiny-sglang"), port=31234).argv[3:] + ["--context-length", "4k"]
    assert facts._replayed(argv) is parser_facts._NOT_REPLAYED  # human_readable_int: sglang's own code
    facts.check(argv)  # the real parser takes it, and the value is kept
    other = argv + ["--tp-size", "1"]
    assert facts._replayed(other) is None  # the same value again: the replica answers
    facts.save()
    adapter.parser_facts.cache_clear()
    assert adapter.parser_facts().remembered and adapter.parser_facts()._replayed(other) is None
    adapter.parser_facts.cache_clear()
