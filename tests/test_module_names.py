"""No two modules of sparkit share a file name unless their packages say what each one is: three
`checkpoint.py` (headers, where a recipe's checkpoint is, tiny-ling's format) or three `metrics.py`
cost every reader a look at the path. Each engine's package may have its own module of a name another
engine's has (`engines/sglang/adapter.py`, `engines/embedded/adapter.py`: the seam's design); the
other names kept twice are listed here, each with why."""

from __future__ import annotations

from collections import defaultdict
from pathlib import PurePosixPath

from _shared import REPO_DIR

# basename -> why more than one module may carry it (each package's own; the package says which)
SHARED_NAMES = {
    "__init__.py": "every package",
    "__main__.py": "`python -m` of a package",
    "runner.py": "bench.runner runs the benchmark, checks.runner the startup checks",
    "compare.py": "bench.compare compares two bench results, evals.compare two GSM8K runs",
    "settings.py": "engines.embedded.settings: the engine's flags; tui.settings: the chat's sampling",
    # the seam's layers each own one part of the rules: the types, the general rules, SGLang's,
    # and the assembly that checks them together for a recipe
    "rules.py": "contract.rules: the Rule/Violation types; recipes.rules: the general rules; "
                "engines.sglang.rules: SGLang's own; planning.rules: all of them checked for a recipe",
    "log.py": "contract.log: the evidence types every log reader returns; engines.sglang.log: SGLang's lines",
    "engine.py": "contract.engine: the adapter seam's types; engines.embedded.engine: the embedded engine",
}


def _one_per_engine(found: list[str]) -> bool:
    """Each file directly in a different engine's package: sparkit/engines/<engine>/<name>."""
    parents = [PurePosixPath(path).parent for path in found]
    return (all(parent.parent == PurePosixPath("sparkit/engines") for parent in parents)
            and len(set(parents)) == len(parents))


def colliding(paths: list[str], allowed: dict[str, str]) -> dict[str, list[str]]:
    """Basenames carried by more than one module, not one per engine and not allowed, and allowed
    ones no longer shared (a stale entry: its reason describes files that are gone)."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        by_name[PurePosixPath(path).name].append(path)
    problems = {name: sorted(found) for name, found in by_name.items()
                if len(found) > 1 and name not in allowed and not _one_per_engine(found)}
    problems.update({name: by_name.get(name, []) for name in allowed if len(by_name.get(name, [])) < 2})
    return problems


def test_sparkit_module_names_collide_only_where_the_package_says_which():
    paths = sorted(p.relative_to(REPO_DIR).as_posix() for p in (REPO_DIR / "sparkit").rglob("*.py"))
    assert not colliding(paths, SHARED_NAMES), (
        "module file names carried twice (rename the one whose name does not say what it is, or "
        f"add a reason to SHARED_NAMES): {colliding(paths, SHARED_NAMES)}")


def test_a_second_checkpoint_py_is_reported_and_so_is_a_stale_exception():
    paths = ["sparkit/checkpoint_headers.py", "sparkit/memory/checkpoint.py", "sparkit/engines/embedded/checkpoint.py",
             "sparkit/bench/runner.py", "sparkit/checks/runner.py",
             "sparkit/engines/sglang/adapter.py", "sparkit/engines/embedded/adapter.py"]
    assert colliding(paths, {"runner.py": "kept"}) == {
        "checkpoint.py": ["sparkit/engines/embedded/checkpoint.py", "sparkit/memory/checkpoint.py"]}
    assert colliding(paths[:1], {"runner.py": "kept"}) == {"runner.py": []}
    # one per engine, but a third module outside the engines' packages is a collision
    assert colliding([*paths[5:], "sparkit/recipes/adapter.py"], {}) == {
        "adapter.py": ["sparkit/engines/embedded/adapter.py", "sparkit/engines/sglang/adapter.py",
                       "sparkit/recipes/adapter.py"]}
