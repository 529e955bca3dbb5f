"""The house drawn from its imports: no import circle in sparkit/, and no import pointing up the
declared layers. Every import counts: the ones inside functions (a lazy import only moves a
circle to run time) and the ones under `if TYPE_CHECKING:` (they never run, but they say what a
module knows about, and a type named from a layer above is a dependency on it all the same).

`python tests/test_import_graph.py` prints the figures: circles, upward arrows, and the imports of
sparkit's own modules that sit inside a function, per module."""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sparkit"

# The layers, lowest first: a module may import its own layer and the ones below, never one above.
# A module's layer is that of the longest prefix naming it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # the plain types every layer speaks, and facts that need nothing of sparkit's
    ("ground", ("sparkit.contract", "sparkit.errors", "sparkit.paths", "sparkit._version", "sparkit.weight_formats",
                "sparkit.api_key", "sparkit.installed_source", "sparkit.checkpoint_headers", "sparkit.kernels",
                "sparkit.env_switch", "sparkit.gpu_specs", "sparkit.notices", "sparkit.interrupts")),
    # what is read from the machine (memory, processes) and the hub, and the HTTP client: no
    # recipe, no engine
    ("sources", ("sparkit.hub", "sparkit.client", "sparkit.memory", "sparkit.roofline.layout",
                 "sparkit.roofline.profiles", "sparkit.roofline.published", "sparkit.runs.processes")),
    # the models sparkit builds and ships (their code, builders, checkpoints, exports): what an
    # engine serves, knowing nothing of recipes or engines
    ("models", ("sparkit.models",)),
    ("recipes", ("sparkit.recipes",)),
    ("engines", ("sparkit.engines",)),
    # above the engines, orchestrating them: rule assembly and compile, and what judges a recipe
    # on a host through its engine's adapter (target fit, the roofline, a model's checkpoint)
    ("planning", ("sparkit.planning", "sparkit.host", "sparkit.roofline", "sparkit.memory.checkpoint_location")),
    # what runs servers and talks to them (the memory fit counts the runs' reservations)
    ("runs", ("sparkit.checks", "sparkit.runs", "sparkit.bench", "sparkit.evals", "sparkit.memory.fit",
              "sparkit.memory.reservations")),
    # the public surface (sparkit/__init__.py), the CLI and the TUI
    ("interface", ("sparkit", "sparkit.__main__", "sparkit.cli", "sparkit.tui")),
]


# The layers whose own-module imports sit at the top of their files: a module there that keeps one
# inside a function says why, once, in a comment starting with LAZY_REASON (what it must not load).
TOP_IMPORTS = ("sparkit.contract", "sparkit.recipes", "sparkit.planning", "sparkit.engines.base",
               "sparkit.engines.builtin_models", "sparkit.engines.activation_report", "sparkit.engines.startup_log",
               "sparkit.engines.sglang", "sparkit.checks", "sparkit.runs", "sparkit.memory", "sparkit.roofline",
               "sparkit.host", "sparkit.hub")
LAZY_REASON = "# Imported inside functions:"


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


@dataclass
class Import:
    """One import statement of the package's own modules."""

    names: set[str]  # the modules it names (a `from a import b` names a.b when b is a module)
    line: int
    in_function: bool


def _statements(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function = True
        names: set[str] = set()
        if isinstance(node, ast.Import):
            names = {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = node.module or ""
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            # `from a import b` runs a (its __init__) to get b, unless b is a module of a's: then
            # it names a.b (a's __init__ runs for any import of a.anything, and is counted where
            # it imports something itself)
            subs = {f"{base}.{alias.name}" for alias in node.names}
            names = (subs & modules.keys()) | ({base} if subs - modules.keys() else set())
        own = {name for name in names if name in modules and name != module}
        if own:
            found.append(Import(own, getattr(node, "lineno", 0), in_function))
        for child in ast.iter_child_nodes(node):
            visit(child, in_function)

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return found


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules `module` imports, TYPE_CHECKING and function bodies included."""
    return {name for statement in _statements(module, path, modules) for name in statement.names}


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package's modules it imports. Importing a.b.c first runs the packages a and
    a.b (their __init__): that is an import of them too where their __init__ imports something,
    unless the importer lies inside them (then they are already being imported)."""
    modules = _modules(root)
    direct = {name: _imports(name, path, modules) for name, path in modules.items()}
    graph = {}
    for name, targets in direct.items():
        packages = {".".join(t.split(".")[:i]) for t in targets for i in range(1, t.count(".") + 1)}
        graph[name] = targets | {p for p in packages if direct.get(p) and p != name and not name.startswith(p + ".")}
    return graph


def lazy_imports(root: Path = PACKAGE) -> dict[str, int]:
    """module -> how many of its import statements of the package's own modules sit inside a
    function (modules with none left out)."""
    modules = _modules(root)
    counts = {name: sum(s.in_function for s in _statements(name, path, modules)) for name, path in modules.items()}
    return {name: n for name, n in sorted(counts.items()) if n}


def unexplained_lazy_imports(root: Path = PACKAGE, prefixes: tuple[str, ...] = TOP_IMPORTS) -> list[str]:
    """Modules under `prefixes` that import one of the package's modules inside a function without
    a LAZY_REASON comment saying why."""
    modules = _modules(root)
    return [name for name in lazy_imports(root)
            if any(name == p or name.startswith(p + ".") for p in prefixes)
            and LAZY_REASON not in modules[name].read_text()]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each as one circle's modules
    in order."""
    return [_circle(graph, component) for component in components(graph)]


def components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan): sets of modules each
    of which reaches every other through imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(set(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def _circle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One concrete circle through the component, for the failure message: a -> b -> ... -> a."""
    start = min(component)
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in component)
        back = [w for w in nxt if w == start]
        if back and len(path) > 1:
            return path + [start]
        step = next((w for w in nxt if w not in seen), None)
        if step is None:
            return path + [nxt[0]] if nxt else path
        path.append(step)
        seen.add(step)


def layer_of(module: str, layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> int | None:
    """The index in `layers` of the longest prefix naming `module` (None: no layer names it)."""
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for i, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), i)
    return None if best is None else best[1]


def upward_arrows(graph: dict[str, set[str]], layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> list[str]:
    """Every import from a module to one in a higher layer, as "a (layer) -> b (layer)"."""
    out = []
    for module in sorted(graph):
        here = layer_of(module, layers)
        for target in sorted(graph[module]):
            there = layer_of(target, layers)
            if here is not None and there is not None and there > here:
                out.append(f"{module} ({layers[here][0]}) -> {target} ({layers[there][0]})")
    return out


def test_no_import_circle_in_sparkit():
    found = cycles(import_graph())
    assert not found, "import circles:\n" + "\n".join("  " + " -> ".join(c) for c in found)


def test_every_module_has_a_layer():
    unplaced = [m for m in import_graph() if layer_of(m) is None]
    assert not unplaced, f"modules no layer names (add them to LAYERS): {unplaced}"


def test_no_import_points_up_the_layers():
    found = upward_arrows(import_graph())
    assert not found, "imports pointing to a higher layer:\n" + "\n".join("  " + a for a in found)


def test_a_lazy_import_in_the_lower_layers_says_why():
    found = unexplained_lazy_imports()
    assert not found, (f"own-module imports inside functions, with no {LAZY_REASON!r} comment saying why (move "
                       "them to the top of the file, or say what they must not load):\n  " + "\n  ".join(found))


def test_an_unexplained_lazy_import_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "heavy.py").write_text("X = 1\n")
    (pkg / "low.py").write_text("def f():\n    from pkg.heavy import X\n    return X\n")
    (pkg / "elsewhere.py").write_text("def f():\n    from pkg.heavy import X\n    return X\n")
    assert unexplained_lazy_imports(pkg, ("pkg.low",)) == ["pkg.low"]
    (pkg / "low.py").write_text(f"{LAZY_REASON} pkg.heavy loads torch\ndef f():\n    from pkg.heavy import X\n")
    assert unexplained_lazy_imports(pkg, ("pkg.low",)) == []


def test_the_walker_sees_a_lazy_circle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\n")
    (pkg / "d.py").write_text("import pkg.c\n")
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.b", "pkg.a"]]
    assert lazy_imports(pkg) == {"pkg.b": 1}


def test_the_walker_sees_a_circle_through_a_package_init(tmp_path):
    """Importing pkg.runs.store runs pkg/runs/__init__.py first: when that imports what imports
    back, it is a circle, though no module names the other directly."""
    pkg = tmp_path / "pkg"
    (pkg / "runs").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "runs" / "__init__.py").write_text("from pkg.runs.pipeline import up\n")
    (pkg / "runs" / "pipeline.py").write_text("from pkg import fit\n")
    (pkg / "runs" / "store.py").write_text("")
    (pkg / "fit.py").write_text("from pkg.runs.store import Run\n")
    assert cycles(import_graph(pkg)) == [["pkg.fit", "pkg.runs", "pkg.runs.pipeline", "pkg.fit"]]
    (pkg / "runs" / "__init__.py").write_text("")
    assert cycles(import_graph(pkg)) == []


def test_the_walker_sees_a_circle_through_type_checking(tmp_path):
    """A type named under TYPE_CHECKING from a module that imports this one is a circle too (the
    one issue 27 found: engines.base named LoadedRecipe, Rule, ReadRules, LogEvidence that way)."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n")
    (pkg / "d.py").write_text("import pkg.c\n")
    assert cycles(import_graph(pkg)) == [["pkg.c", "pkg.d", "pkg.c"]]
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\n")
    assert cycles(import_graph(pkg)) == []


def test_the_walker_sees_an_upward_arrow(tmp_path):
    """An import from a low layer to a higher one is reported, lazy or under TYPE_CHECKING; the
    same import downwards, or within a layer, is not."""
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "types.py").write_text("X = 1\n")
    (pkg / "high.py").write_text("from pkg.low.types import X\n")
    layers = [("low", ("pkg.low",)), ("high", ("pkg.high", "pkg"))]
    assert upward_arrows(import_graph(pkg), layers) == []
    (pkg / "low" / "types.py").write_text("def f():\n    from pkg.high import Y\n")
    assert upward_arrows(import_graph(pkg), layers) == ["pkg.low.types (low) -> pkg.high (high)"]
    (pkg / "low" / "types.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.high\n")
    assert upward_arrows(import_graph(pkg), layers) == ["pkg.low.types (low) -> pkg.high (high)"]
    # the longest prefix decides: pkg.low.types is "low" though "pkg" is "high"
    assert layer_of("pkg.low.types", layers) == 0 and layer_of("pkg.other", layers) == 1


def main() -> int:
    graph = import_graph()
    lines = sum(len(p.read_text().splitlines()) for p in _modules(PACKAGE).values())
    found, arrows, lazy = components(graph), upward_arrows(graph), lazy_imports()
    print(f"{len(graph)} modules, {lines} lines, {sum(map(len, graph.values()))} import edges")
    print(f"circles (TYPE_CHECKING and function bodies included): {len(found)}"
          + "".join(f"\n  {len(c)} modules in a circle, e.g. " + " -> ".join(_circle(graph, c)) + "\n    all: "
                    + " ".join(sorted(c)) for c in found))
    print(f"imports pointing up the layers: {len(arrows)}" + "".join(f"\n  {a}" for a in arrows))
    total = sum(lazy.values())
    print(f"own-module imports inside a function: {total} ({1000 * total / lines:.1f} per 1000 lines)")
    for module, n in sorted(lazy.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:4d} {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
