"""The README's exit-code table is what the commands do: real `sparkit` processes, their exit
status and their one `error:` line, for the mistakes a newcomer makes first."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sparkit import errors

from _shared import GSM8K_DIR, REPO_DIR


def sparkit(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPARKIT_HOME": str(home), "COLUMNS": "200"}
    env.pop("SPARKIT_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "sparkit", *args], env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def assert_one_error(done: subprocess.CompletedProcess, code: int) -> None:
    assert done.returncode == code, (done.returncode, done.stderr)
    assert done.stderr.startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def dead_url() -> str:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_the_readme_table_lists_exactly_the_codes_of_the_error_classes():
    readme = (REPO_DIR / "README.md").read_text()
    table = readme.split("## Exit codes", 1)[1].split("\n\n", 2)[1]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, flags=re.M)}
    classes = {c.exit_code for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.SparkitError)}
    assert documented == classes | {0, errors.EXIT_INTERRUPTED}


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ["stack.nonexistent=1", "notakey", "nonexistent.x=1", "stack.lm_head.x=1",
                                        "stack.speculative.nonexistent=1", "extends=tiny"])
def test_a_bad_set_path_is_usage_exit_2(sparkit_home, assignment):
    for command in (["plan", "tiny"], ["recipes", "show", "tiny"], ["up", "tiny"]):
        done = sparkit(sparkit_home, *command, "--set", assignment)
        assert_one_error(done, 2)
        assert "--set " in done.stderr and done.stdout == ""


def test_a_bad_value_for_a_real_key_stays_a_recipe_error_exit_3_naming_the_key(sparkit_home):
    done = sparkit(sparkit_home, "plan", "tiny", "--set", "stack.lm_head=fp16")
    assert_one_error(done, 3)
    assert "error: --set stack.lm_head: 'fp16' is not one of bf16, fp32, fp8" in done.stderr


@pytest.mark.slow
def test_no_server_found_reads_the_same_for_every_command_that_needs_one(sparkit_home):
    outcomes = {}
    for command in (["chat"], ["bench"], ["eval", "gsm8k", "--data", str(GSM8K_DIR), "--limit", "1"], ["check"]):
        done = sparkit(sparkit_home, *command)
        assert_one_error(done, 7)
        outcomes[command[0]] = done.stderr
    assert len(set(outcomes.values())) == 1, outcomes
    assert outcomes["chat"] == "error: no running server found\nhint: start one with `sparkit up`, or pass --url URL\n"


@pytest.mark.slow
def test_a_url_where_nothing_listens_is_exit_7_saying_no_server_answered(sparkit_home, tmp_path):
    url = dead_url()
    commands = {
        "chat": ["chat", "--url", url],
        "bench": ["bench", "--url", url, "--out", str(tmp_path / "bench.json")],
        "eval": ["eval", "gsm8k", "--url", url, "--data", str(GSM8K_DIR), "--limit", "1", "--out", str(tmp_path / "e.jsonl")],
        "check": ["check", "--url", url, "--recipe", "tiny", "--json"],
    }
    for name, command in commands.items():
        done = sparkit(sparkit_home, *command)
        assert done.returncode == 7, (name, done.stderr)
        assert "Traceback" not in done.stderr and "internal error" not in done.stderr
        errors_ = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors_) == 1 and f"no server answered at {url}" in errors_[0], (name, done.stderr)
        if name != "eval":  # eval first says what it will do and keeps its results file (resumable)
            assert done.stderr.startswith(f"error: no server answered at {url}\n"), (name, done.stderr)
        assert "went away" not in done.stderr and "broke off" not in done.stderr
        assert done.stdout == "", name
    # the results file was started (its header) so that the run can be resumed once a server is up
    assert (tmp_path / "e.jsonl").read_text().splitlines()[0].startswith('{"type": "header"')


def test_python_m_sparkit_keeps_its_exit_code_after_a_ctrl_c_that_was_handled(sparkit_home, tmp_path):
    """Under `python -m`, CPython remembers a KeyboardInterrupt that left an exec() of a string even
    after it was caught (a Ctrl-C landing while a dataclass is built), and then dies by SIGINT instead
    of exiting with the code asked for: `up` interrupted while starting exited -2, not 130, in 7 of 50
    tries. sparkit's __main__ clears that memory, so the command's own code is what the shell sees."""
    probe = tmp_path / "interrupted_then_sparkit.py"
    probe.write_text(
        "import runpy, sys\n"
        "import sparkit.cli.main as cli\n"
        "shown = cli._print_error\n"
        "def interrupted_then_shown(*args):\n"
        "    try:\n"
        "        exec('raise KeyboardInterrupt')  # where a Ctrl-C lands inside a dataclass's generated code\n"
        "    except KeyboardInterrupt:\n"
        "        pass  # handled, as sparkit handles Ctrl-C\n"
        "    shown(*args)\n"
        "cli._print_error = interrupted_then_shown  # the last thing before sparkit exits\n"
        "sys.argv = ['sparkit', 'plan', 'no-such-recipe']\n"
        "runpy.run_module('sparkit', run_name='__main__', alter_sys=True)\n")
    env = {**os.environ, "SPARKIT_HOME": str(sparkit_home), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_DIR)])}
    done = subprocess.run([sys.executable, "-m", probe.stem], env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert_one_error(done, errors.RecipeError.exit_code)
