"""`scripts/test` run for real (bash, its own venv logic) against a stand-in `python` that
answers `-m pip install` as pip does once sglang is installed with --no-deps: the resolver's
sixty lines about sglang become one note, anything else pip says stays, and a failed install
still fails the script before pytest runs."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

from _shared import REPO_DIR

SGLANG_DEPS = ["aiohttp", "anthropic", "blobfile", "compressed-tensors", "cuda-python", "datasets", "einops",
               "fastapi", "flashinfer_python", "hf_transfer", "interegular", "llguidance", "modelscope", "ninja",
               "openai", "outlines", "partial_json_parser", "prometheus-client", "py-spy", "python-multipart",
               "sgl-kernel", "soundfile", "tiktoken", "torchao", "transformers", "uvicorn", "uvloop", "xgrammar"]

FAKE_PYTHON = r"""#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG"
if [ "$1 $2" = "-m pip" ]; then
  case "$*" in *"$FAKE_FAIL"*)
    echo "ERROR: Could not find a version that satisfies the requirement $FAKE_FAIL (from versions: none)" >&2
    exit 1;;
  esac
  case "$*" in *--no-deps*|*torch==*) exit 0;; esac
  echo "ERROR: pip's dependency resolver does not currently take into account all the packages that are installed. This behaviour is the source of the following dependency conflicts." >&2
  for dep in $SGLANG_DEPS; do echo "sglang 0.5.23 requires $dep, which is not installed." >&2; done
  echo "sglang 0.5.23 requires torch==2.9.1, but you have torch 2.13.0 which is incompatible." >&2
  if [ -n "${FAKE_OTHER:-}" ]; then echo "$FAKE_OTHER" >&2; fi
  exit 0
fi
if [ "$1 $2" = "-m pytest" ]; then echo "pytest ran: $*"; exit 0; fi
if [ "$1" = "-c" ]; then echo "${FAKE_TORCH:-2.13.0+cpu}"; fi
exit 0
"""


def resolving_installs() -> int:
    """The script's installs that run pip's resolver (the stand-in answers those with the sglang
    lines): every pip_install but the --no-deps one and the torch pin."""
    lines = [line.strip() for line in (REPO_DIR / "scripts" / "test").read_text().splitlines()]
    installs = [line for line in lines if line.startswith("pip_install ")]
    return len([line for line in installs if "--no-deps" not in line and "torch==" not in line])


def checkout(tmp_path):
    """The script in a copy of the repo whose .venv holds the stand-in python."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO_DIR / "scripts" / "test", repo / "scripts" / "test")
    shutil.copy(REPO_DIR / "pyproject.toml", repo / "pyproject.toml")
    shutil.copy(REPO_DIR / "constraints.txt", repo / "constraints.txt")
    bin_dir = repo / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "python").chmod(0o755 | stat.S_IEXEC)
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    return repo


def run_script(repo, tmp_path, **env):
    full_env = {**os.environ, "FAKE_LOG": str(tmp_path / "calls.log"), "FAKE_FAIL": "no-such-package",
                "SGLANG_DEPS": " ".join(SGLANG_DEPS), **env}
    return subprocess.run(["bash", str(repo / "scripts" / "test"), "-q", "tests/x"], cwd=tmp_path,
                          env=full_env, capture_output=True, text=True, timeout=60)


def test_sglangs_unmet_requirements_are_one_note_and_the_tests_run(tmp_path):
    repo = checkout(tmp_path)
    done = run_script(repo, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "sglang 0.5.23 requires" not in done.stderr and "dependency resolver" not in done.stderr
    notes = [line for line in done.stderr.splitlines() if "note:" in line]
    per_install = len(SGLANG_DEPS) + 1
    resolving = resolving_installs()
    assert len(notes) == 1 and f"listed {resolving * per_install} unmet requirement(s) of sglang" in notes[0], done.stderr
    assert len(done.stderr.splitlines()) == 2  # "installing ..." and the note
    assert "pytest ran: -m pytest -q -n 2 --dist loadfile -q tests/x" in done.stdout  # two workers by default
    assert (repo / ".venv" / ".sparkit-test-deps").exists()


def test_every_install_is_pinned_by_the_constraints_file(tmp_path):
    """A fresh clone installs the versions the tests were written against (constraints.txt), not
    whatever is newest on the index that day; a changed constraints file reinstalls."""
    repo = checkout(tmp_path)
    assert run_script(repo, tmp_path).returncode == 0
    installs = [line for line in (tmp_path / "calls.log").read_text().splitlines() if line.startswith("-m pip install")]
    assert len(installs) == len([line for line in (REPO_DIR / "scripts" / "test").read_text().splitlines()
                                 if line.strip().startswith("pip_install ")])
    assert all(" -c constraints.txt " in f" {line} " for line in installs), installs
    (tmp_path / "calls.log").unlink()
    assert run_script(repo, tmp_path).returncode == 0
    assert "-m pip install" not in (tmp_path / "calls.log").read_text()  # nothing changed: nothing installed
    with open(repo / "constraints.txt", "a") as handle:
        handle.write("six==1.16.0\n")
    assert run_script(repo, tmp_path).returncode == 0
    assert "-m pip install" in (tmp_path / "calls.log").read_text()


def test_a_conflict_of_another_package_is_still_shown(tmp_path):
    repo = checkout(tmp_path)
    other = "openai 1.40.0 requires httpx<0.28, but you have httpx 0.28.1 which is incompatible."
    done = run_script(repo, tmp_path, FAKE_OTHER=other)
    assert done.returncode == 0, done.stderr
    resolving = resolving_installs()
    assert done.stderr.count(other) == resolving and done.stderr.count("ERROR: pip's dependency resolver") == resolving
    assert "sglang 0.5.23 requires" not in done.stderr


def test_a_failed_install_fails_the_script_before_pytest(tmp_path):
    repo = checkout(tmp_path)
    done = run_script(repo, tmp_path, FAKE_FAIL="triton")
    assert done.returncode != 0
    assert "ERROR: Could not find a version that satisfies the requirement triton" in done.stderr
    assert "pytest ran" not in done.stdout and "-m pytest" not in (tmp_path / "calls.log").read_text()
    assert not (repo / ".venv" / ".sparkit-test-deps").exists()  # the next run installs again
