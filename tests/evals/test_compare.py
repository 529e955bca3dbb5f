"""Paired comparison on results files: discordant counts, McNemar p, the verdict."""

from __future__ import annotations

import json

import pytest

from sparkit.errors import DataError
from sparkit.evals.compare import compare_files, verdict


def _write(path, outcomes: dict[int, bool], gold="7", settings_hash="h"):
    lines = [{"type": "header", "settings": {"data_sha256": "d"}, "settings_hash": settings_hash}]
    for qid, ok in outcomes.items():
        answer = gold if ok else "0"
        lines.append({"type": "result", "id": qid, "gold": gold, "strict": answer, "flexible": answer,
                      "correct": {"strict": ok, "flexible": ok}})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_run_compared_with_itself_shows_no_difference(tmp_path):
    a = _write(tmp_path / "a.jsonl", {i: i % 3 != 0 for i in range(60)})
    result = compare_files(a, a)
    flex = result["metrics"]["flexible"]
    assert result["n_paired"] == 60 and flex["b_discordant"] == 0 and flex["c_discordant"] == 0
    assert result["mcnemar_p"] == 1.0 and result["verdict"].startswith("no detectable difference at alpha 0.05")


def test_a_real_regression_is_called_with_its_size_and_p(tmp_path):
    # 100 paired questions: A right on all, B wrong on 12 of them -> b = 12, c = 0.
    a = _write(tmp_path / "a.jsonl", {i: True for i in range(100)})
    b = _write(tmp_path / "b.jsonl", {i: i >= 12 for i in range(100)})
    result = compare_files(a, b)
    flex = result["metrics"]["flexible"]
    assert (flex["b_discordant"], flex["c_discordant"]) == (12, 0)
    assert flex["mcnemar_p"] == pytest.approx(2 * 0.5**12)
    assert result["verdict"] == f"B is worse by 12.00 points, p = {2 * 0.5**12:.3g}"
    assert flex["a"]["value"] == 1.0 and flex["b"]["value"] == 0.88


def test_pairs_only_questions_both_runs_answered(tmp_path):
    a = _write(tmp_path / "a.jsonl", {i: True for i in range(10)})
    b = _write(tmp_path / "b.jsonl", {i: True for i in range(5, 20)}, settings_hash="other")
    result = compare_files(a, b)
    assert result["n_paired"] == 5 and result["a_only_answered"] == 5 and result["b_only_answered"] == 10
    assert result["same_settings"] is False


def test_runs_on_different_data_are_refused(tmp_path):
    a = _write(tmp_path / "a.jsonl", {0: True}, gold="7")
    b = _write(tmp_path / "b.jsonl", {0: True}, gold="8")
    with pytest.raises(DataError, match="disagree on the gold answer"):
        compare_files(a, b)
    c = _write(tmp_path / "c.jsonl", {5: True})
    with pytest.raises(DataError, match="no question in common"):
        compare_files(a, c)


def test_small_differences_are_not_called_a_regression():
    assert verdict(0.9689, 0.9682, 1.0).startswith("no detectable difference")
    assert verdict(0.90, 0.95, 0.01) == "B is better by 5.00 points, p = 0.01"
