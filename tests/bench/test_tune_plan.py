"""tune's sweep grid, implied overrides, ranking and recipe writing (no servers)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sparkit.bench.tune import SweepPoint, rank, write_best_recipe
from sparkit.bench.tune_params import grid, overrides_for, parse_params
from sparkit.errors import UsageError


def test_param_grid_is_the_cartesian_product():
    params = parse_params(["speculative.num_steps=1,2", "stack.lm_head=bf16,fp8"])
    assert grid(params) == [
        {"speculative.num_steps": "1", "stack.lm_head": "bf16"},
        {"speculative.num_steps": "1", "stack.lm_head": "fp8"},
        {"speculative.num_steps": "2", "stack.lm_head": "bf16"},
        {"speculative.num_steps": "2", "stack.lm_head": "fp8"},
    ]


@pytest.mark.parametrize("bad", ["speculative.num_steps", "=1,2", "speculative.num_steps="])
def test_malformed_param_is_a_usage_error(bad):
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_params([bad])


def test_num_steps_implies_nextn_chain_and_draft_tokens():
    recipe = SimpleNamespace(stack=SimpleNamespace(speculative=SimpleNamespace(method="none", eagle_topk=None)))
    sets = overrides_for({"speculative.num_steps": "3"}, recipe)
    assert "stack.speculative.num_steps=3" in sets
    assert "stack.speculative.method=nextn" in sets
    assert "stack.speculative.num_draft_tokens=4" in sets
    assert "stack.speculative.eagle_topk=1" in sets


def point(label_value, tpots, step_factor):
    return SweepPoint(
        values={"speculative.num_steps": label_value},
        overrides=[],
        status="done",
        figures={"tpot_mean_ms": sum(tpots) / len(tpots), "step_time_estimate_ms": sum(tpots) / len(tpots) * step_factor},
        tpot_per_request_ms=tpots,
    )


def test_rank_picks_a_measurably_faster_depth():
    points = [point("1", [10.0, 10.2, 9.8, 10.1], 1.6), point("2", [7.0, 7.1, 6.9, 7.2], 2.5), point("3", [7.5, 7.4, 7.6, 7.5], 3.0)]
    ranking = rank(points)
    assert ranking.best == 1 and ranking.baseline == 0
    assert ranking.measurably_better is True
    assert "measurably better" in ranking.verdict


def test_rank_says_honestly_when_no_depth_beats_the_first():
    points = [point("1", [10.0, 11.0, 9.0, 10.0], 1.6), point("2", [9.9, 11.1, 9.1, 9.7], 2.5)]
    ranking = rank(points)
    assert ranking.measurably_better is False
    assert ranking.verdict.startswith("no point is measurably better") or ranking.verdict.startswith("none of the other")


def test_within_noise_the_cheaper_step_wins():
    points = [point("1", [10.0, 10.2, 9.8, 10.1], 1.6), point("2", [7.0, 7.1, 6.9, 7.2], 2.5), point("3", [6.95, 7.15, 6.85, 7.15], 3.0)]
    ranking = rank(points)
    assert ranking.best == 1  # depth 3 is within noise of depth 2 but has a dearer step


def test_best_recipe_goes_to_a_new_file_that_extends_the_original(tmp_path):
    source = tmp_path / "mine.yaml"
    source.write_text("model: {path: x}\n")
    first = write_best_recipe(source, ["stack.speculative.num_steps=3"], "steps 3", label="num_steps=3")
    second = write_best_recipe(source, ["stack.speculative.num_steps=3"], "steps 3", label="num_steps=3")
    assert first != second and first.exists() and second.exists()
    assert source.read_text() == "model: {path: x}\n"
    import yaml

    body = yaml.safe_load(first.read_text())
    assert body["extends"] == "mine.yaml"
    assert body["stack"]["speculative"]["num_steps"] == 3


def test_tuned_recipe_for_a_shipped_recipe_loads_and_carries_the_winning_depth(tmp_path):
    from sparkit.recipes.load import load_recipe

    base = load_recipe("tiny")
    sets = overrides_for({"speculative.num_steps": "2"}, base.recipe)
    assert all(load_recipe("tiny", sets).recipe.stack.speculative.num_steps == 2 for _ in [0])
    written = write_best_recipe(base.path, sets, "num_steps=2", directory=tmp_path, label="num_steps=2")
    tuned = load_recipe(str(written))
    assert tuned.recipe.stack.speculative.num_steps == 2
    assert tuned.recipe.stack.speculative.num_draft_tokens == 3
    assert tuned.recipe.stack.lm_head == base.recipe.stack.lm_head  # everything else inherited


def test_a_tuned_shipped_recipe_goes_to_the_current_directory_and_extends_it_by_name(tmp_path, monkeypatch):
    from sparkit.bench.tune import tuned_recipe_dir
    from sparkit.recipes.load import load_recipe

    from _shared import REPO_DIR

    before = set(REPO_DIR.iterdir()), set((REPO_DIR / "recipes" / "tiny").iterdir())
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    base = load_recipe("tiny")
    assert tuned_recipe_dir(base.path) == (elsewhere, "the current directory: tiny is a shipped recipe")
    written = write_best_recipe(base.path, ["stack.speculative.num_steps=2", "stack.speculative.num_draft_tokens=3"],
                                "num_steps=2", label="num_steps=2")
    assert written.parent == elsewhere and written.name == "tiny-tuned-num_steps2.yaml"
    import yaml

    assert yaml.safe_load(written.read_text())["extends"] == "tiny"  # by name: it moves with the install
    assert load_recipe(str(written)).recipe.stack.speculative.num_steps == 2
    assert (set(REPO_DIR.iterdir()), set((REPO_DIR / "recipes" / "tiny").iterdir())) == before  # nothing in the repo


def test_a_tuned_recipe_file_goes_beside_it_wherever_the_command_runs(tmp_path, monkeypatch):
    from sparkit.bench.tune import tuned_recipe_dir

    mine = tmp_path / "mine"
    mine.mkdir()
    source = mine / "my.yaml"
    source.write_text("extends: tiny\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert tuned_recipe_dir(source) == (mine, "beside my.yaml")
    written = write_best_recipe(source, ["stack.speculative.num_steps=2"], "s", label="num_steps=2")
    assert written.parent == mine and list(cwd.iterdir()) == []
    assert tuned_recipe_dir(source, tmp_path / "out") == (tmp_path / "out", "--recipe-dir")


def test_an_invalid_value_is_refused_before_any_server_starts(tmp_path):
    from sparkit.bench.runner import BenchConfig
    from sparkit.bench.tune import run_tune
    from sparkit.errors import RecipeError

    with pytest.raises(RecipeError, match="num_steps"):
        run_tune("tiny", ["speculative.num_steps=2,0"], BenchConfig(), out_path=tmp_path / "s.json")
    assert not (tmp_path / "s.json").exists()


def test_a_point_whose_startup_checks_failed_is_never_recommended():
    from sparkit.bench.tune import SweepPoint, rank

    def point(label: str, tpot: float, failed: list[str]) -> SweepPoint:
        return SweepPoint(values={"stack.speculative.num_steps": label}, overrides=[], status="done",
                          figures={"tpot_mean_ms": tpot}, tpot_per_request_ms=[tpot] * 8, startup_failed=failed)

    points = [point("3", 2.0, []), point("5", 1.0, ["acceptance"])]
    ranking = rank(points)
    assert ranking.best == 0 and 1 not in ranking.order  # the faster point's draft was not doing its job
    only_failed = rank([points[1]])
    assert only_failed.best is None and "rejected: num_steps=5 (startup checks failed: acceptance)" in only_failed.verdict


# -- engine switches: the parameter grammar ---------------------------------------------------------


def test_env_and_flag_params_parse_with_their_kind():
    env, valued, bare = parse_params(["env.SGLANG_ENABLE_METADATA_GLUE_GRAPH=0,1", "flag.--num-continuous-decode-steps=1,4",
                                      "flag.--disable-overlap-schedule"])
    assert (env.kind, env.name, env.values) == ("env", "SGLANG_ENABLE_METADATA_GLUE_GRAPH", ["0", "1"])
    assert (valued.kind, valued.name, valued.values, valued.bare) == ("flag", "--num-continuous-decode-steps", ["1", "4"], False)
    assert (bare.kind, bare.name, bare.values, bare.bare) == ("flag", "--disable-overlap-schedule", ["off", "on"], True)


@pytest.mark.parametrize(("spec", "says"), [
    ("env.=1", "is not an environment variable name"),
    ("env.1BAD=0,1", "is not an environment variable name"),
    ("env.SGLANG_X", "expected KEY=VALUE"),
    ("flag.disable-overlap-schedule", "is not a flag"),
    ("flag.-x", "is not a flag"),
    ("flag.--x=", "give the flag's values"),
])
def test_a_malformed_switch_is_a_usage_error_naming_it(spec, says):
    with pytest.raises(UsageError) as info:
        parse_params([spec])
    assert says in info.value.message and spec.split("=")[0] in info.value.message
    assert "env." in info.value.hint and "flag." in info.value.hint


def test_the_same_switch_twice_is_refused():
    with pytest.raises(UsageError, match="given twice"):
        parse_params(["flag.--x", "flag.--x=1,2"])


def test_switch_points_become_env_and_extra_args_assignments():
    from sparkit.recipes.load import load_recipe

    params = parse_params(["env.SGLANG_X=0,1", "flag.--disable-overlap-schedule", "flag.--num-continuous-decode-steps=4"])
    base = SimpleNamespace(server=SimpleNamespace(extra_args=["--num-continuous-decode-steps", "2", "--keep", "v"]))
    on = overrides_for({"env.SGLANG_X": "1", "flag.--disable-overlap-schedule": "on",
                        "flag.--num-continuous-decode-steps": "4"}, base, params)
    assert on == ['server.env.SGLANG_X="1"',
                  'server.extra_args=["--keep", "v", "--disable-overlap-schedule", "--num-continuous-decode-steps", "4"]']
    off = overrides_for({"env.SGLANG_X": "0", "flag.--disable-overlap-schedule": "off",
                         "flag.--num-continuous-decode-steps": "4"}, base, params)
    assert off[1] == 'server.extra_args=["--keep", "v", "--num-continuous-decode-steps", "4"]'
    # the assignments are --set's: a recipe loads with them, the env value verbatim ("on" stays "on")
    loaded = load_recipe("tiny", ['server.env.SPARKIT_X="on"', 'server.extra_args=["--max-connections", "64"]'])
    assert loaded.recipe.server.env["SPARKIT_X"] == "on" and loaded.recipe.server.extra_args == ["--max-connections", "64"]


def test_a_flag_the_engine_does_not_have_is_refused_naming_it_before_any_server_starts(tmp_path):
    from sparkit.bench.runner import BenchConfig
    from sparkit.bench.tune import run_tune
    from sparkit.errors import RecipeError

    with pytest.raises(RecipeError) as info:
        run_tune("tiny", ["flag.--no-such-switch"], BenchConfig(), out_path=tmp_path / "s.json")
    assert info.value.message.startswith("--param flag.--no-such-switch (on): ")
    assert "--no-such-switch" in info.value.message.split(": ", 1)[1]
    with pytest.raises(RecipeError) as info:
        run_tune("tiny", ["flag.--max-connections=64,many"], BenchConfig(), out_path=tmp_path / "s.json")
    assert info.value.message.startswith("--param flag.--max-connections=many: ") and "many" in info.value.message
    assert not (tmp_path / "s.json").exists()


# -- A/B/A: the noise band and the rejected points -------------------------------------------------


def _done(label: str, tpots: list[float], **kw) -> SweepPoint:
    return SweepPoint(values={"flag.--x": label}, overrides=[], status="done",
                      figures={"tpot_mean_ms": sum(tpots) / len(tpots)}, tpot_per_request_ms=tpots, **kw)


def test_the_baselines_drift_between_its_runs_widens_the_noise_band():
    """B is 0.5 ms faster than A's first run, well outside the paired noise; but A itself moved by
    2 ms between its first and last run (A/B/A): B's gain over A (1.5 ms against A's mean) is
    within the noise band."""
    a1 = _done("off", [10.0, 10.1, 9.9, 10.0])
    b = _done("on", [9.5, 9.6, 9.4, 9.5])
    steady = rank([a1, b], again=_done("off", [10.0, 10.1, 9.9, 10.0]))
    assert steady.measurably_better is True and steady.drift_ms == 0.0
    drifted = rank([a1, b], again=_done("off", [12.0, 12.1, 11.9, 12.0]))
    assert drifted.drift_ms == pytest.approx(2.0) and drifted.noise_ms == pytest.approx(2.0)
    assert drifted.tpot_gain_ms == pytest.approx(1.5)
    assert drifted.measurably_better is False and "within the noise band 2.000 ms" in drifted.verdict


def test_a_point_that_changes_greedy_outputs_is_rejected_as_a_loss():
    fast = _done("on", [5.0, 5.1, 4.9, 5.0], output_change="1 of 4 greedy 48-token outputs differ")
    ranking = rank([_done("off", [10.0, 10.1, 9.9, 10.0]), fast])
    assert ranking.best == 0 and ranking.order == [0]
    assert ranking.rejected == {"--x=on": "changes greedy outputs: 1 of 4 greedy 48-token outputs differ"}
