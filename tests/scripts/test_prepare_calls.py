"""benchmarks/sglang_h200/prepare.sh prints the H200 kit's `run` calls: every one must fit the
64 MiB a `run` call takes (this tree + the ignored paths it carries), and a layout that cannot fit
is refused with exit 2 rather than printed. Checked on a scratch git repository holding sparse
files of the real sizes (the lead's session 11: a 19 MiB tree, 15 pieces, 17 MB of deps), with
PRINT_ONLY=1 so that nothing is downloaded or built."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from _shared import REPO_DIR

LIMIT = 64 * 1048576
TREE = 19_960_595  # the tree the session-11 calls carried
DEPS = 17_244_133


def _repo(tmp_path: Path, pieces: list[int], *, bench_serving: bool = False) -> Path:
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "sglang_h200").mkdir(parents=True)
    shutil.copy(REPO_DIR / "benchmarks" / "sglang_h200" / "prepare.sh", repo / "benchmarks" / "sglang_h200")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / ".gitignore").write_text("/.sglang-h200/\n")
    tree_now = sum(p.stat().st_size for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts)
    with open(repo / "tree.bin", "wb") as handle:  # sparse: the tree's size, no bytes written
        handle.truncate(TREE - tree_now)
    kit = repo / ".sglang-h200"
    for i, size in enumerate(pieces):
        (kit / f"p{i:02d}").mkdir(parents=True)
        with open(kit / f"p{i:02d}" / f"payload.part.{i:02d}", "wb") as handle:
            handle.truncate(size)
    (kit / "deps").mkdir(parents=True)
    with open(kit / "deps" / "cuda_bindings.whl", "wb") as handle:
        handle.truncate(DEPS)
    if bench_serving:
        (kit / "b01").mkdir()
        with open(kit / "b01" / "datasets.whl", "wb") as handle:
            handle.truncate(14_000_000)
    for name, text in (("scripts/dev_setup.sh", "x" * 40_000), ("gsm8k/test.jsonl", "y" * 37_000)):
        (kit / name).parent.mkdir(exist_ok=True)
        (kit / name).write_text(text)
    return repo


def _print_calls(repo: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "benchmarks/sglang_h200/prepare.sh"], cwd=repo, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "PRINT_ONLY": "1", "KIT": str(repo / "nokit"), **env})


def _calls(stdout: str) -> list[tuple[str, list[str]]]:
    """(command, carry) of every printed run() call (a call may continue on the next line)."""
    text = re.sub(r'",\n\s+carry=', '", carry=', stdout)
    return [(m.group(1), re.findall(r'"([^"]+)"', m.group(2)))
            for m in re.finditer(r'run\(command="(.*?)", carry=\[(.*?)\]', text)]


def _bytes(repo: Path, path: str) -> int:
    return sum(p.stat().st_size for p in (repo / path).rglob("*") if p.is_file())


def test_every_printed_call_fits_what_a_run_call_takes(tmp_path):
    # the session-11 layout: pieces sized for the tree with 2 MiB to spare, the last one shorter
    repo = _repo(tmp_path, [45_054_802] * 14 + [34_095_492])
    done = _print_calls(repo, SESSION_ENV="STEPS=setup,hostgap")
    assert done.returncode == 0, done.stderr
    calls = _calls(done.stdout)
    assert len(calls) == 16  # 15 pieces and the deps, each its own call
    for command, carry in calls:
        carried = TREE + sum(_bytes(repo, path) for path in carry)
        assert carried < LIMIT - 1048576, (command, carry, carried / 1048576)
    deps_calls = [c for c in calls if ".sglang-h200/deps" in c[1]]
    assert len(deps_calls) == 1 and deps_calls[0][1] == [".sglang-h200/deps"]
    assert "cp -r .sglang-h200/deps /tmp/acc/" in deps_calls[0][0]
    # the last call: the last piece, then the session with the asked settings, carrying what it reads
    command, carry = calls[-1]
    assert carry == [".sglang-h200/p14", ".sglang-h200/scripts", ".sglang-h200/gsm8k"]
    assert command.endswith("STEPS=setup,hostgap OUT=$OUT bash benchmarks/sglang_h200/session.sh")
    assert "cp .sglang-h200/p14/* /tmp/acc/" in command
    assert calls.index(deps_calls[0]) < len(calls) - 1


def test_bench_serving_deps_ride_with_the_deps_not_with_the_last_piece(tmp_path):
    repo = _repo(tmp_path, [45_054_802] * 3 + [34_095_492], bench_serving=True)
    done = _print_calls(repo)
    assert done.returncode == 0, done.stderr
    calls = _calls(done.stdout)
    deps = next(c for c in calls if ".sglang-h200/deps" in c[1])
    assert deps[1] == [".sglang-h200/deps", ".sglang-h200/b01"]
    assert "cp .sglang-h200/b01/* /tmp/acc/bdeps/" in deps[0]
    assert ".sglang-h200/b01" not in calls[-1][1]
    for _command, carry in calls:
        assert TREE + sum(_bytes(repo, path) for path in carry) < LIMIT


@pytest.mark.parametrize("piece", [46_500_000, 60_500_000])
def test_a_piece_that_cannot_fit_is_refused_not_printed_as_if_it_did(tmp_path, piece):
    repo = _repo(tmp_path, [piece, piece, 1_000_000])
    done = _print_calls(repo)
    assert done.returncode == 2
    assert "would be refused: set PIECE smaller" in done.stderr
    assert f"now {piece} bytes a piece" in done.stderr


def test_print_only_without_pieces_says_so(tmp_path):
    repo = _repo(tmp_path, [])
    done = _print_calls(repo)
    assert done.returncode == 2
    assert "no pieces under .sglang-h200/" in done.stderr
