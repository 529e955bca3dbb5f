"""Regressions from a newcomer's audit of the CLI: exit codes, messages, Ctrl-C, help.

Commands run as real `sparkit` processes (exit codes and stdout/stderr are what a user
and a script see); the e2e ones talk to a real embedded server started by `sparkit up`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkit.runs import Run, RunState, list_runs


def sparkit_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SPARKIT_DEBUG", None)  # users run without it: no traceback either way
    env.update({"SPARKIT_HOME": str(home), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "COLUMNS": "160"})
    return env


def run_sparkit(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sparkit", *args], env=sparkit_env(home), capture_output=True, text=True, timeout=timeout
    )


def assert_clean_error(result: subprocess.CompletedProcess, code: int) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    assert result.stderr.startswith("error:") or "\nerror:" in result.stderr, result.stderr


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- no server needed ------------------------------------------------------------------


def test_check_of_an_unreachable_url_is_exit_7_with_one_message(sparkit_home):
    url = f"http://127.0.0.1:{free_port()}"
    result = run_sparkit(sparkit_home, "check", "--url", url, "--recipe", "tiny", "--json")
    assert_clean_error(result, 7)
    assert f"no server answered at {url}" in result.stderr
    assert result.stdout == ""  # no half a report for scripts to misread
    assert "startup check" not in result.stderr


def _write_run(home: Path, run_id: str, started_at: str) -> Run:
    run = Run(id=run_id, recipe_name="tiny", recipe_path=None, engine="embedded", url="http://127.0.0.1:1",
              host="127.0.0.1", port=1, started_at=started_at, root=home / "runs")
    run.save()
    return run


def test_runs_are_ordered_by_start_even_after_an_old_one_is_stopped(sparkit_home):
    old = _write_run(sparkit_home, "tiny-old", "2026-01-01T00:00:00+00:00")
    new = _write_run(sparkit_home, "tiny-new", "2026-01-02T00:00:00+00:00")
    time.sleep(0.01)
    old.state = RunState.STOPPED  # stopping rewrites meta.json: the old run's file is now the newest
    old.save()
    assert [r.id for r in list_runs()] == [old.id, new.id]


def test_logs_without_a_run_shows_the_latest_started_one(sparkit_home):
    old = _write_run(sparkit_home, "tiny-old", "2026-01-01T00:00:00+00:00")
    new = _write_run(sparkit_home, "tiny-new", "2026-01-02T00:00:00+00:00")
    new.log_path.write_text("new run's log\n")
    old.log_path.write_text("old run's log\n")
    old.save()
    result = run_sparkit(sparkit_home, "logs")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "new run's log\n"


# -- against a real server started by `sparkit up` -------------------------------------


@pytest.fixture(scope="module")
def live_run(tiny_model_dir, tmp_path_factory):
    home = tmp_path_factory.mktemp("ux-home")
    up = run_sparkit(home, "up", "tiny", "--set", f"model.path={tiny_model_dir}", "--port", "auto", "--detach", "--json")
    assert up.returncode == 0, up.stderr
    doc = json.loads(up.stdout)
    yield home, doc
    run_sparkit(home, "down", "--all")


@pytest.mark.e2e
def test_ctrl_c_in_logs_follow_exits_130_without_a_traceback(live_run):
    home, _ = live_run
    proc = subprocess.Popen([sys.executable, "-m", "sparkit", "logs", "-f"], env=sparkit_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    # Ctrl-C once it follows (the log's tail printed), not at a fixed time: on a busy machine the
    # command may still be importing after 3 s, where Python's own KeyboardInterrupt is not ours
    import threading

    lines: list[str] = []
    following = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if "ready" in line:
                following.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert following.wait(120), "".join(lines)  # the log's tail was printed first
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends to the foreground group
    err = proc.stderr.read()
    proc.wait(timeout=30)
    reader.join(10)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Aborted" not in err


@pytest.mark.e2e
def test_eval_prompt_over_the_context_names_the_flags_that_fix_it(live_run, tmp_path):
    from _shared import GSM8K_DIR

    home, doc = live_run
    result = run_sparkit(home, "eval", "gsm8k", "--data", str(GSM8K_DIR / "test.jsonl"), "--limit", "1",
                         "--greedy", "--max-tokens", "32", "--out", str(tmp_path / "r.jsonl"))
    assert_clean_error(result, 7)
    assert "context length" in result.stderr
    assert "--shots" in result.stderr and "--max-tokens" in result.stderr
    # The README's tour command, which fits tiny-ling's context, works.
    result = run_sparkit(home, "eval", "gsm8k", "--data", str(GSM8K_DIR / "test.jsonl"), "--limit", "1",
                         "--greedy", "--shots", "1", "--max-tokens", "256", "--json", "--out", str(tmp_path / "ok.jsonl"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["n"] == 1


@pytest.mark.e2e
def test_bench_where_every_request_fails_is_exit_7_not_an_empty_table(live_run, tmp_path):
    home, _ = live_run
    result = run_sparkit(home, "bench", "--input-len", "4096", "--output-len", "8", "--num-prompts", "1",
                         "--warmup", "0", "--json", "--out", str(tmp_path / "b.json"))
    assert_clean_error(result, 7)
    assert "failed" in result.stderr and "context length" in result.stderr
    assert "--input-len" in result.stderr
    assert result.stdout == ""
    result = run_sparkit(home, "bench", "--input-len", "16", "--output-len", "8", "--num-prompts", "1",
                         "--json", "--out", str(tmp_path / "ok.json"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["complete"] is True


def _all_command_paths() -> list[list[str]]:
    import typer.main

    from sparkit.cli.main import app

    paths: list[list[str]] = []

    def walk(command, prefix: list[str]) -> None:
        paths.append(prefix)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*prefix, name])

    walk(typer.main.get_command(app), [])
    return paths


def test_every_help_names_option_values_and_shows_no_python_types(capsys, monkeypatch):
    from sparkit.cli.main import main

    monkeypatch.setenv("COLUMNS", "200")
    paths = _all_command_paths()
    assert ["up"] in paths and ["bench", "compare"] in paths and ["eval", "gsm8k"] in paths
    for path in paths:
        with pytest.raises(SystemExit) as exit_info:
            main([*path, "--help"])
        assert exit_info.value.code in (0, None), path
        text = capsys.readouterr().out
        for python_type in ("<bool>", "<list[", "<int", "<float", "<path>", "<str>"):
            assert python_type not in text, (path, python_type, text)
    with pytest.raises(SystemExit):
        main(["up", "--help"])
    text = capsys.readouterr().out
    assert "KEY=VALUE" in text and "SECONDS" in text


def test_eval_sampling_defaults_are_visible_in_help(capsys, monkeypatch):
    from sparkit.cli.main import main

    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main(["eval", "gsm8k", "--help"])
    text = capsys.readouterr().out
    assert "default 0.6" in text and "default 0.95" in text and "default 29" in text


def test_a_recipe_with_two_mistakes_reports_both_with_their_lines(sparkit_home, tmp_path):
    recipe = tmp_path / "two-mistakes.yaml"
    recipe.write_text('extends: tiny\nserver:\n  port: "x"\n  bogus: 1\n')
    result = run_sparkit(sparkit_home, "plan", str(recipe))
    assert_clean_error(result, 3)
    assert f"{recipe}:3:9 server.port" in result.stderr
    assert f"{recipe}:4:10 server.bogus: unknown key 'bogus'" in result.stderr


def test_recipes_list_reads_the_spark_ladder_in_order(sparkit_home):
    result = run_sparkit(sparkit_home, "recipes", "list", "--json")
    assert result.returncode == 0, result.stderr
    names = [r["name"] for r in json.loads(result.stdout)]
    ladder = [n for n in names if n.startswith("ling-3.0-flash/spark-")]
    assert ladder == ["ling-3.0-flash/spark-baseline", "ling-3.0-flash/spark-humming",
                      "ling-3.0-flash/spark-humming-fp8head", "ling-3.0-flash/spark-optimized"]


def _readme_tour() -> list[str]:
    from _shared import REPO_DIR

    text = (REPO_DIR / "README.md").read_text()
    tour = text.split("## A tour", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in tour.strip().splitlines()]


@pytest.mark.slow
def test_readme_tour_commands_that_need_no_server_work_as_written(sparkit_home):
    import shlex

    tour = _readme_tour()
    offline = [c for c in tour if c.split()[1] in ("recipes", "plan", "doctor")]
    assert len(offline) == 5, tour
    for command in offline:
        result = run_sparkit(sparkit_home, *shlex.split(command)[1:])
        assert result.returncode == 0, (command, result.stderr)
        if "--json" in command:
            json.loads(result.stdout)


def test_readme_tour_flags_exist(capsys, monkeypatch):
    """Every --flag the tour shows is in that command's --help."""
    import shlex

    from sparkit.cli.main import main

    monkeypatch.setenv("COLUMNS", "200")
    for command in _readme_tour():
        words = shlex.split(command)[1:]
        path = [w for w in words[:2] if not w.startswith("-") and w in ("eval", "gsm8k", "recipes", "list", "bench", "model")]
        path = path or words[:1]
        with pytest.raises(SystemExit):
            main([*path, "--help"])
        text = capsys.readouterr().out
        for flag in (w.split("=", 1)[0] for w in words if w.startswith("--")):
            assert flag in text, (command, flag)


def test_chat_open_of_a_missing_chat_is_a_usage_error_listing_saved_ones(sparkit_home):
    result = run_sparkit(sparkit_home, "chat", "--open", "99")
    assert_clean_error(result, 2)
    assert "--open 99: no saved chat" in result.stderr and "no chats saved yet" in result.stderr

    from sparkit.tui.history import ChatStore

    store = ChatStore()  # SPARKIT_HOME is the test's: the same store `sparkit chat` reads
    saved = store.new_conversation("hello", model="tiny-ling", server_url="http://127.0.0.1:1", system_prompt=None)
    store.close()
    result = run_sparkit(sparkit_home, "chat", "--open", "99")
    assert_clean_error(result, 2)
    assert f"recent chats: {saved}" in result.stderr


def test_every_json_flag_promises_the_same_thing(capsys, monkeypatch):
    from sparkit.cli.main import main

    monkeypatch.setenv("COLUMNS", "250")
    with_json = 0
    for path in _all_command_paths():
        with pytest.raises(SystemExit):
            main([*path, "--help"])
        lines = [line for line in capsys.readouterr().out.splitlines() if "--json" in line]
        for line in lines:
            with_json += 1
            assert "One JSON document on stdout (progress and messages on stderr)." in line, (path, line)
    assert with_json >= 14


def test_a_mistyped_bench_compare_suggests_the_subcommand(sparkit_home):
    result = run_sparkit(sparkit_home, "bench", "comapre")
    assert_clean_error(result, 2)
    assert "did you mean `sparkit bench compare`" in result.stderr


def test_output_paths_are_checked_before_any_work(sparkit_home, tmp_path):
    from _shared import GSM8K_DIR

    url = f"http://127.0.0.1:{free_port()}"  # never contacted: the path is refused first
    result = run_sparkit(sparkit_home, "eval", "gsm8k", "--url", url, "--data", str(GSM8K_DIR / "test.jsonl"),
                         "--limit", "1", "--out", str(tmp_path))
    assert_clean_error(result, 2)
    assert f"--out {tmp_path}: is a directory" in result.stderr
    result = run_sparkit(sparkit_home, "bench", "--url", url, "--out", "/proc/no-such-dir/b.json")
    assert_clean_error(result, 2)
    assert "--out /proc/no-such-dir/b.json: cannot create /proc/no-such-dir" in result.stderr
    (tmp_path / "f").write_text("")
    result = run_sparkit(sparkit_home, "tune", "tiny", "--param", "speculative.num_steps=1", "--recipe-dir", str(tmp_path / "f"))
    assert_clean_error(result, 2)
    assert "not a directory" in result.stderr


def test_an_unreadable_input_path_is_named_without_a_traceback(sparkit_home, tmp_path):
    result = run_sparkit(sparkit_home, "bench", "compare", str(tmp_path), str(tmp_path))
    assert_clean_error(result, 1)
    assert f"{tmp_path}: Is a directory" in result.stderr


def test_usage_mistakes_read_like_every_other_error(sparkit_home):
    result = run_sparkit(sparkit_home, "status", "--bogus")
    assert_clean_error(result, 2)
    assert result.stderr.startswith("error: No such option: --bogus")
    assert "`sparkit status --help`" in result.stderr
    result = run_sparkit(sparkit_home, "up", "--timeout", "soon")
    assert_clean_error(result, 2)
    assert "'--timeout'" in result.stderr and "╭" not in result.stderr  # one line, not a box
    result = run_sparkit(sparkit_home, "eval")  # a bare group shows its help, no empty error line
    assert "gsm8k" in result.stdout and "error" not in result.stderr


@pytest.mark.e2e
def test_status_keeps_each_live_run_on_one_line_in_120_columns(live_run):
    home, doc = live_run
    env = {**sparkit_env(home), "COLUMNS": "120"}
    result = subprocess.run([sys.executable, "-m", "sparkit", "status"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    row = [line for line in result.stdout.splitlines() if doc["run"] in line]
    assert len(row) == 1, result.stdout
    assert doc["url"].removeprefix("http://") in row[0] and "running" in row[0]


def test_a_binary_file_given_as_recipe_is_a_recipe_error(sparkit_home, tmp_path):
    recipe = tmp_path / "model.safetensors.yaml"
    recipe.write_bytes(b"\xef\x00\xff\xfe" * 16)
    result = run_sparkit(sparkit_home, "plan", str(recipe))
    assert_clean_error(result, 3)
    assert f"{recipe}: not a text (UTF-8) file" in result.stderr


def test_a_binary_file_given_as_bench_result_is_a_data_error(sparkit_home, tmp_path):
    result_file = tmp_path / "a.json"
    result_file.write_bytes(b"\xef\x00\xff\xfe" * 16)
    result = run_sparkit(sparkit_home, "bench", "compare", str(result_file), str(result_file))
    assert_clean_error(result, 8)
    assert f"{result_file}: not a JSON bench result" in result.stderr
