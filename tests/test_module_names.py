"""No two modules of sparkit share a file name unless their packages say what each one is: three
`checkpoint.py` (headers, where a recipe's checkpoint is, tiny-ling's format) or three `metrics.py`
cost every reader a look at the path. The names kept twice are listed here, each with why."""

from __future__ import annotations

from collections import defaultdict
from pathlib import PurePosixPath

from _shared import REPO_DIR

# basename -> why more than one module may carry it (each package's own; the package says which)
SHARED_NAMES = {
    "__init__.py": "every package",
    "__main__.py": "`python -m` of a package",
    "adapter.py": "one per engine, by the seam's design: sparkit.engines.<engine>.adapter",
    "runner.py": "bench.runner runs the benchmark, checks.runner the startup checks",
    "compare.py": "bench.compare compares two bench results, evals.compare two GSM8K runs",
    "settings.py": "engines.embedded.settings: the engine's flags; tui.settings: the chat's sampling",
}


def colliding(paths: list[str], allowed: dict[str, str]) -> dict[str, list[str]]:
    """Basenames carried by more than one module and not allowed, and allowed ones no longer shared
    (a stale entry: its reason describes files that are gone)."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        by_name[PurePosixPath(path).name].append(path)
    problems = {name: sorted(found) for name, found in by_name.items() if len(found) > 1 and name not in allowed}
    problems.update({name: by_name.get(name, []) for name in allowed if len(by_name.get(name, [])) < 2})
    return problems


def test_sparkit_module_names_collide_only_where_the_package_says_which():
    paths = sorted(p.relative_to(REPO_DIR).as_posix() for p in (REPO_DIR / "sparkit").rglob("*.py"))
    assert not colliding(paths, SHARED_NAMES), (
        "module file names carried twice (rename the one whose name does not say what it is, or "
        f"add a reason to SHARED_NAMES): {colliding(paths, SHARED_NAMES)}")


def test_a_second_checkpoint_py_is_reported_and_so_is_a_stale_exception():
    paths = ["sparkit/checkpoint_headers.py", "sparkit/memory/checkpoint.py", "sparkit/engines/embedded/checkpoint.py",
             "sparkit/bench/runner.py", "sparkit/checks/runner.py"]
    assert colliding(paths, {"runner.py": "kept"}) == {
        "checkpoint.py": ["sparkit/engines/embedded/checkpoint.py", "sparkit/memory/checkpoint.py"]}
    assert colliding(paths[:1], {"runner.py": "kept"}) == {"runner.py": []}
