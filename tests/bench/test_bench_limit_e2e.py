"""`sparkit bench` against a real embedded server puts the measured decode speed next to the
recipe's bandwidth limit, evaluated at the workload it ran (context, accept length)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def bench(url: str, home, out, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPARKIT_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "sparkit", "bench", "--url", url, "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=180, env=env)


def test_bench_reports_decode_speed_as_a_fraction_of_the_recipes_limit(embedded_server, tmp_path, monkeypatch):
    from sparkit.recipes.load import load_recipe
    from sparkit.roofline.bandwidth import Bandwidth, Measurement, save_measurement, this_host
    from sparkit.roofline.estimate import estimate

    home = tmp_path / "home"
    monkeypatch.setenv("SPARKIT_HOME", str(home))
    save_measurement(Measurement(this_host(), "cpu", "test", 20.0, 25.0, 1 << 26, 1, "stored by the test", "2026-12-01"))
    out = tmp_path / "b.json"
    done = bench(embedded_server.url, home, out, "--recipe", "tiny", "--set", "target=cpu", "--input-len", "40",
                 "--output-len", "32", "--num-prompts", "3", "--warmup", "0")
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    limit = doc["limit"]
    figures = doc["summary"]["figures"]
    assert limit["bandwidth"]["source"] == "measured" and limit["bandwidth"]["gb_s"] == 20.0
    assert limit["context_tokens"] == 40 + 32 // 2  # prompt + half the output, as the requests ran
    accept = figures["accept_length_mean"]
    assert limit["accept_length"] == accept and accept > 1
    expected = estimate(load_recipe("tiny", ["target=cpu"]).recipe, context=56,
                        bandwidth=Bandwidth(20.0, 1, "measured", "t")).tok_s(round(accept, 4))
    assert limit["limit_tok_s"] == pytest.approx(expected, rel=1e-9)
    decode = 1000 / figures["tpot_mean_ms"]
    assert limit["fraction_of_limit"] == pytest.approx(decode / expected)
    sentence = (f"decode {decode:.1f} tok/s (1/mean TPOT) = {decode / expected:.0%} of the {expected:,.0f} tok/s "
                f"bandwidth limit for this recipe at accept {accept:.2f}, context 56 tokens; step time")
    assert sentence in done.stdout


def test_a_server_of_unknown_recipe_gets_no_limit_and_is_told_how(embedded_server, tmp_path):
    out = tmp_path / "u.json"
    done = bench(embedded_server.url, tmp_path / "home", out, "--input-len", "16", "--output-len", "8",
                 "--num-prompts", "1", "--warmup", "0")
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["limit"] is None
    assert "no bandwidth limit: the server's recipe is unknown (--recipe names it)" in done.stdout
    wrong = bench(embedded_server.url, tmp_path / "home", out, "--set", "target=cpu")
    assert wrong.returncode == 2 and "--set needs --recipe" in wrong.stderr
