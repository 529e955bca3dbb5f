"""`sparkit chat` command-line errors (the app itself is tested through Pilot)."""

from __future__ import annotations

import pytest

from sparkit.cli.main import main


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code, capsys.readouterr().err


def test_without_a_running_server_it_says_how_to_start_one(sparkit_home, capsys):
    code, err = run_cli(["chat"], capsys)
    assert code == 7  # no server to talk to, as for a --url where nothing answers
    assert "no running server found" in err and "sparkit up" in err


def test_a_run_and_a_url_together_are_refused(sparkit_home, capsys):
    code, err = run_cli(["chat", "tiny", "--url", "http://127.0.0.1:30000"], capsys)
    assert code == 2
    assert "give a RUN or --url, not both" in err


def test_an_unknown_run_is_named(sparkit_home, capsys):
    code, err = run_cli(["chat", "no-such-run"], capsys)
    assert code == 2
    assert "no run matches 'no-such-run'" in err
