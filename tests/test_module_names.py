"""No two modules of sparkit share a file name unless their packages say what each one is: three
`checkpoint.py` (headers, where a recipe's checkpoint is, tiny-ling's format) or three `metrics.py`
cost every reader a look at the path. Each engine's package may have its own module of a name another
engine's has (`engines/sglang/adapter.py`, `engines/embedded/adapter.py`: the seam's design), and so
may each model family's (`models/tiny_ling/model.py`, `models/tiny_ling_v3/model.py`: the families'
common interface); the modules of `sparkit/cli/commands/` are each named for the `sparkit` command
they hold (`commands/pull.py` is `sparkit pull`, `hub/pull.py` what it runs), so a name there may be
another module's too; the other names kept twice are listed here, each with why."""

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
    # a DSpark draft is no model family (it drafts for one): its builder and files are its own
    "builder.py": "models.builder: trains every model family; models.dspark.builder: the DSpark draft, "
                  "trained on its target's own text",
    "checkpoint.py": "models.checkpoint: every family's files and HF exports; models.dspark.checkpoint: "
                     "the DSpark draft's, in SGLang's LingDSparkModel layout",
}


def _one_per_engine(found: list[str]) -> bool:
    """Each file directly in a different engine's package (sparkit/engines/<engine>/<name>), or
    each in a different model family's (sparkit/models/<family>/<name>)."""
    parents = [PurePosixPath(path).parent for path in found]
    return (any(all(parent.parent == PurePosixPath(root) for parent in parents)
                for root in ("sparkit/engines", "sparkit/models"))
            and len(set(parents)) == len(parents))


def _a_command(path: str, commands: set[str]) -> bool:
    """sparkit/cli/commands/<name>.py holding `sparkit <name>`."""
    where = PurePosixPath(path)
    return where.parent == PurePosixPath("sparkit/cli/commands") and where.stem in commands


def colliding(paths: list[str], allowed: dict[str, str], commands: set[str] = frozenset()) -> dict[str, list[str]]:
    """Basenames carried by more than one module, not one per engine, not a command's module of
    `commands` and not allowed, and allowed ones no longer shared (a stale entry: its reason
    describes files that are gone)."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        if not _a_command(path, commands):
            by_name[PurePosixPath(path).name].append(path)
    problems = {name: sorted(found) for name, found in by_name.items()
                if len(found) > 1 and name not in allowed and not _one_per_engine(found)}
    problems.update({name: by_name.get(name, []) for name in allowed if len(by_name.get(name, [])) < 2})
    return problems


def test_sparkit_module_names_collide_only_where_the_package_says_which():
    from sparkit.cli.commands import COMMANDS

    paths = sorted(p.relative_to(REPO_DIR).as_posix() for p in (REPO_DIR / "sparkit").rglob("*.py"))
    found = colliding(paths, SHARED_NAMES, set(COMMANDS))
    assert not found, ("module file names carried twice (rename the one whose name does not say what it is, or "
                       f"add a reason to SHARED_NAMES): {found}")


def test_every_command_module_holds_its_command_and_nothing_else_sits_there():
    """sparkit/cli/commands/ holds one module per `sparkit` command, named for it, and no other."""
    from sparkit.cli.commands import COMMANDS

    modules = {p.stem for p in (REPO_DIR / "sparkit" / "cli" / "commands").glob("*.py")} - {"__init__"}
    assert modules == {info.module for info in COMMANDS.values()} == {name.replace("-", "_") for name in COMMANDS}


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
    # a command's module may share its name (`sparkit pull`, hub/pull.py); a module there that is
    # no command may not
    pulls = ["sparkit/hub/pull.py", "sparkit/cli/commands/pull.py"]
    assert colliding(pulls, {}, {"pull"}) == {}
    assert colliding(pulls, {}, {"plan"}) == {"pull.py": pulls[::-1]}
    # one per model family likewise; one in a family and one in an engine is a collision
    families = ["sparkit/models/tiny_ling/model.py", "sparkit/models/tiny_ling_v3/model.py"]
    assert colliding(families, {}) == {}
    assert colliding([families[0], "sparkit/engines/embedded/model.py"], {}) == {
        "model.py": ["sparkit/engines/embedded/model.py", "sparkit/models/tiny_ling/model.py"]}
