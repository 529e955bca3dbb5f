"""What installed Python packages accept, read from their source without importing them.

SGLang's stack (sglang, sgl_kernel, humming, flashinfer) mostly cannot be imported on a machine
without CUDA, and importing it where it can costs seconds and initialises GPU libraries. Its
source can always be read: this module finds a package's files (`find_spec` of a top-level name
executes nothing), parses them with `ast`, and answers three questions a compatibility judgement
needs (sparkit.engines.sglang.compat):

* which names a consumer module imports from a provider package, where, and how guarded
  (unconditional, under a CUDA guard, optional under try/except, or for another platform);
* whether each name exists in the provider's installed source (following re-exports);
* which keywords each call of such a name passes, against the parameters its definition takes.

Values are plain dataclasses; nothing here imports the packages it reads.
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import sys
from dataclasses import dataclass, field
from pathlib import Path

# How an import is guarded, from the strongest need to none.
REQUIRED = "required"  # module level or inside a function, unconditionally (or under a CUDA guard)
CONDITIONAL = "conditional"  # under an `if` that is not a platform test
OPTIONAL = "optional"  # inside `try: ... except ImportError` (the consumer copes without it)
OTHER_PLATFORM = "other-platform"  # under an `if` for ROCm, NPU, XPU, MUSA, CPU, ...: not this path

# Words in an `if` test that select a platform other than CUDA (sglang's is_hip(), _is_npu,
# _use_aiter, is_cpu(), ...); a test naming CUDA selects this path.
_OTHER_PLATFORMS = ("hip", "npu", "musa", "xpu", "aiter", "cpu", "mps", "rocm", "amx", "hpu", "gfx")


@dataclass(frozen=True)
class Package:
    """An installed package's source: its import name and the directory (or file) it lives in."""

    name: str
    root: Path  # the package directory, or the module file of a single-module distribution

    def module_file(self, dotted: str) -> Path | None:
        """The source file of `dotted` (a module inside this package), None when absent."""
        parts = dotted.split(".")
        if parts[0] != self.name:
            return None
        if self.root.is_file():
            return self.root if len(parts) == 1 else None
        base = self.root.joinpath(*parts[1:])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def is_package_dir(self, dotted: str) -> bool:
        parts = dotted.split(".")
        return parts[0] == self.name and self.root.is_dir() and self.root.joinpath(*parts[1:]).is_dir()


def locate(name: str, search_path: list[str] | None = None) -> Package | None:
    """Where the top-level package `name` is installed (None when it is not). Nothing runs: the
    finders only look at the file system (a top-level find_spec imports no parent)."""
    try:
        spec = importlib.machinery.PathFinder.find_spec(name, search_path)
        if spec is None and search_path is None:
            spec = _find_on_meta_path(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        locations = list(spec.submodule_search_locations)
        return Package(name, Path(locations[0])) if locations else None
    if spec.origin and spec.origin.endswith(".py"):
        return Package(name, Path(spec.origin))
    return None  # an extension module: no source to read


# Finders on sys.meta_path that look at nothing of an install of their own (PathFinder is asked first).
_NOT_INSTALL_FINDERS = (importlib.machinery.PathFinder, importlib.machinery.BuiltinImporter,
                        importlib.machinery.FrozenImporter)


def _find_on_meta_path(name: str):
    """A package that no directory on sys.path holds, found by another finder on sys.meta_path, as
    an import would find it: an editable install (pip install -e) puts setuptools'
    `__editable___<dist>_finder` there, which maps the name to the source checkout."""
    for finder in sys.meta_path:
        if finder in _NOT_INSTALL_FINDERS or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(name, None)
        if spec is not None:
            return spec
    return None


@functools.lru_cache(maxsize=512)
def parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8", errors="replace"), str(path))
    except (OSError, SyntaxError, ValueError):
        return None


# ------------------------------------------------------------------ definitions


@dataclass(frozen=True)
class Definition:
    """A name as its provider defines it: a function, a class, a module or another value."""

    symbol: str  # where it is defined: module.name (after re-exports), or the module itself
    kind: str  # "function" | "class" | "module" | "value" | "lazy" (a module __getattr__ may provide it)
    file: Path
    line: int
    parameters: tuple[str, ...] | None = None  # keyword-passable parameters; None = takes **kwargs or unknown
    node: ast.AST | None = field(default=None, compare=False, repr=False)


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef, drop_first: bool) -> tuple[str, ...] | None:
    args = fn.args
    if args.kwarg is not None:
        return None
    names = [a.arg for a in args.args] + [a.arg for a in args.kwonlyargs]  # positional-only ones cannot be keywords
    if drop_first and args.args:
        names = names[1:]
    return tuple(names)


def _decorators(node) -> set[str]:
    out = set()
    for d in getattr(node, "decorator_list", []):
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Attribute):
            out.add(target.attr)
        elif isinstance(target, ast.Name):
            out.add(target.id)
    return out


def _class_parameters(cls: ast.ClassDef) -> tuple[str, ...] | None:
    """What `Cls(...)` takes: its own __init__, else a dataclass's fields; None when it cannot be
    told from this class alone (inherited __init__, metaclass magic)."""
    init = next((n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "__init__"), None)
    if init is not None:
        return _parameters(init, drop_first=True)
    if "dataclass" in _decorators(cls) and not cls.bases:
        return tuple(n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                     and not _is_classvar(n.annotation))
    return None


def _is_classvar(annotation) -> bool:
    text = ast.unparse(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar"))


def _top_level(tree: ast.Module, name: str):
    """The top-level statement of a module that binds `name` (last one wins, as at run time),
    looking into `if`/`try` blocks at module level."""
    found = None

    def visit(body):
        nonlocal found
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                found = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name) and n.id == name:
                            found = node
            elif isinstance(node, (ast.ImportFrom, ast.Import)):
                for alias in node.names:
                    bound = alias.asname or (alias.name.split(".")[0] if isinstance(node, ast.Import) else alias.name)
                    if bound == name:
                        found = node
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.With):  # `with contextlib.suppress(ImportError): from .x import y`
                visit(node.body)

    visit(tree.body)
    return found


def _star_imports(tree: ast.Module) -> list[ast.ImportFrom]:
    """`from x import *` statements at module level (inside if/try/with blocks too)."""
    out = []

    def visit(body):
        for node in body:
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                out.append(node)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(tree.body)
    return out


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join(base + ([node.module] if node.module else []))


def resolve(package: Package, module: str, name: str | None = None, _depth: int = 0) -> Definition | None:
    """The definition of `module.name` in the installed source (re-exports followed), or of the
    module itself when `name` is None. None when the provider has no such name."""
    if _depth > 8:
        return None
    path = package.module_file(module)
    if name is None:
        if path is not None:
            return Definition(module, "module", path, 1)
        return None
    if path is None:
        return None
    tree = parse(path)
    if tree is None:
        return None
    node = _top_level(tree, name)
    if node is None:
        # `from pkg import submodule` binds a submodule that pkg/__init__ need not mention
        sub = f"{module}.{name}"
        if package.module_file(sub) is not None and package.is_package_dir(module):
            return Definition(sub, "module", package.module_file(sub), 1)
        for star in _star_imports(tree):  # `from pkg.ops import *`
            source = _absolute(module, star, path.name == "__init__.py")
            if source.split(".")[0] == package.name:
                found = resolve(package, source, name, _depth + 1)
                if found is not None:
                    return found
        lazy = _top_level(tree, "__getattr__")
        if isinstance(lazy, ast.FunctionDef):  # a module __getattr__ may make any name: cannot tell
            return Definition(f"{module}.{name}", "lazy", path, lazy.lineno)
        return None
    symbol = f"{module}.{name}"
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return Definition(symbol, "function", path, node.lineno, _parameters(node, drop_first=False), node)
    if isinstance(node, ast.ClassDef):
        return Definition(symbol, "class", path, node.lineno, _class_parameters(node), node)
    if isinstance(node, ast.ImportFrom):
        source = _absolute(module, node, path.name == "__init__.py")
        original = next(a.name for a in node.names if (a.asname or a.name) == name)
        if source.split(".")[0] != package.name:
            return Definition(symbol, "value", path, node.lineno)  # re-exported from another package
        return resolve(package, source, original, _depth + 1) or (
            resolve(package, f"{source}.{original}", None, _depth + 1) if package.module_file(f"{source}.{original}") else None)
    if isinstance(node, ast.Import):
        return Definition(symbol, "module", path, node.lineno)
    return Definition(symbol, "value", path, node.lineno)


def accepted_values(definition: Definition, parameter: str) -> set | None:
    """The values a function admits for a parameter by its own `assert parameter in [...]` (of
    constants), None when it states none."""
    if definition.kind != "function" or definition.node is None:
        return None
    for node in ast.walk(definition.node):
        test = node.test if isinstance(node, ast.Assert) else None
        if (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == parameter
                and len(test.ops) == 1 and isinstance(test.ops[0], ast.In)
                and isinstance(test.comparators[0], (ast.List, ast.Tuple, ast.Set))
                and all(isinstance(e, ast.Constant) for e in test.comparators[0].elts)):
            return {e.value for e in test.comparators[0].elts}
    return None


def method(package: Package, cls: Definition, name: str, _depth: int = 0) -> Definition | None:
    """A method of a class definition (its own body, then bases defined in the same package)."""
    if cls.kind != "class" or cls.node is None or _depth > 6:
        return None
    for node in cls.node.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            static = "staticmethod" in _decorators(node)
            return Definition(f"{cls.symbol}.{name}", "function", cls.file, node.lineno,
                              _parameters(node, drop_first=not static), node)
    module = cls.symbol.rsplit(".", 1)[0]
    for base in cls.node.bases:
        if isinstance(base, ast.Name):
            found = resolve(package, module, base.id)
            if found is not None and found.kind == "class":
                got = method(package, found, name, _depth + 1)
                if got is not None:
                    return got
    return None


# ------------------------------------------------------------------ what a consumer uses


@dataclass(frozen=True)
class ImportUse:
    """`from provider.module import name` (or LazyImport("provider.module", "name")) in a consumer."""

    consumer_file: Path
    line: int
    module: str  # the provider module imported from
    name: str | None  # the name imported (None: `import provider.module`)
    bound_as: str  # the local name
    guard: str  # REQUIRED | CONDITIONAL | OPTIONAL | OTHER_PLATFORM

    @property
    def where(self) -> str:
        return f"{self.consumer_file}:{self.line}"


@dataclass(frozen=True)
class CallUse:
    """A call in a consumer of a name imported from the provider, with the keywords it passes."""

    consumer_file: Path
    line: int
    imported: ImportUse
    attribute: str | None  # `Imported.attribute(...)` (a class's static or class method), else None
    keywords: tuple[str, ...]
    text: str  # the call as written, shortened

    @property
    def where(self) -> str:
        return f"{self.consumer_file}:{self.line}"


def _platform_of(node: ast.AST) -> str | None:
    """"cuda" or "other" for a test that names a platform (`_is_cuda`, `is_hip()`), else None."""
    words = " ".join(n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else ""
                     for n in ast.walk(node)).lower()
    if "cuda" in words:
        return "cuda"
    if any(p in words for p in _OTHER_PLATFORMS):
        return "other"
    return None


def _guard_of_test(test: ast.AST) -> str:
    """What an `if` test means for the CUDA path: REQUIRED when CUDA takes the branch
    (`_is_cuda`, `_is_cuda or _is_hip`), OTHER_PLATFORM when only another platform does,
    CONDITIONAL when it depends on something else."""
    if isinstance(test, ast.BoolOp):
        parts = [_guard_of_test(v) for v in test.values]
        if isinstance(test.op, ast.Or):
            if REQUIRED in parts:
                return REQUIRED
            return OTHER_PLATFORM if all(p == OTHER_PLATFORM for p in parts) else CONDITIONAL
        if OTHER_PLATFORM in parts:
            return OTHER_PLATFORM
        return REQUIRED if all(p == REQUIRED for p in parts) else CONDITIONAL
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _guard_of_test(test.operand)
        return OTHER_PLATFORM if inner == REQUIRED else CONDITIONAL
    platform = _platform_of(test)
    if platform == "cuda":
        return REQUIRED
    if platform == "other":
        return OTHER_PLATFORM
    return CONDITIONAL


def _platform_scope(name: str) -> bool:
    """A function or class for another platform by its name (`grouped_topk_xpu`, `forward_npu`)."""
    return bool(set(name.lower().split("_")) & set(_OTHER_PLATFORMS))


def _weaker(a: str, b: str) -> str:
    order = [REQUIRED, CONDITIONAL, OPTIONAL, OTHER_PLATFORM]
    return max(a, b, key=order.index)


def _catches_import_errors(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = {n.id for n in ast.walk(handler.type) if isinstance(n, ast.Name)}
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException", "OSError", "AttributeError"})


def imports_from(consumer_file: Path, consumer_module: str, provider: str) -> list[ImportUse]:
    """Every import of `provider` (a top-level package name) in one consumer file, at any depth,
    with its guard; `LazyImport("provider.x", "name")` counts as an import of name."""
    tree = parse(consumer_file)
    if tree is None:
        return []
    found: list[ImportUse] = []
    is_package = consumer_file.name == "__init__.py"

    def is_provider(module: str) -> bool:
        return module == provider or module.startswith(provider + ".")

    def visit(node: ast.AST, guard: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _platform_scope(node.name):
            guard = OTHER_PLATFORM
        if isinstance(node, ast.If):
            inner = _guard_of_test(node.test)
            for child in node.body:
                visit(child, _weaker(guard, inner))
            # the else branch of a CUDA test is another platform; of another platform's test, ours
            other = OTHER_PLATFORM if inner == REQUIRED else (guard if inner == OTHER_PLATFORM else _weaker(guard, CONDITIONAL))
            for child in node.orelse:
                visit(child, other)
            return
        if isinstance(node, ast.Try):
            # optional: some handler catches a failed import and goes on (one that re-raises,
            # with a better message, still needs the import)
            optional = any(_catches_import_errors(h) and not any(isinstance(n, ast.Raise) for n in h.body)
                           for h in node.handlers)
            for child in node.body:
                visit(child, _weaker(guard, OPTIONAL) if optional else guard)
            for part in (*node.handlers, *node.orelse, *node.finalbody):
                visit(part, guard)
            return
        if isinstance(node, ast.ImportFrom):
            module = _absolute(consumer_module, node, is_package)
            if is_provider(module):
                for alias in node.names:
                    found.append(ImportUse(consumer_file, node.lineno, module, alias.name, alias.asname or alias.name, guard))
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_provider(alias.name):
                    found.append(ImportUse(consumer_file, node.lineno, alias.name, None,
                                           alias.asname or alias.name.split(".")[0], guard))
            return
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id == "LazyImport"
                and len(node.value.args) == 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, str)
                                                      for a in node.value.args)
                and is_provider(node.value.args[0].value)):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found.append(ImportUse(consumer_file, node.lineno, node.value.args[0].value,
                                           node.value.args[1].value, target.id, guard))
        for child in ast.iter_child_nodes(node):
            visit(child, guard)

    for stmt in tree.body:
        visit(stmt, REQUIRED)
    return found


def calls_of(consumer_file: Path, uses: list[ImportUse]) -> list[CallUse]:
    """Calls in the file of the names `uses` bound: `name(...)` and `name.attr(...)`, including
    through a plain rebinding (`quantize_weight = _quantize_weight`, sglang's lazy imports)."""
    tree = parse(consumer_file)
    if tree is None:
        return []
    bound: dict[str, ImportUse] = {u.bound_as: u for u in uses if u.name is not None}
    nodes = list(ast.walk(tree))
    renames = [n for n in nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name)]
    changed = True
    while changed:  # rebindings, flow-insensitively: `x = alias` anywhere binds x to alias's import
        changed = False
        for node in renames:
            if node.value.id in bound:
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id not in bound:
                        bound[target.id] = bound[node.value.id]
                        changed = True
    out: list[CallUse] = []
    for node in nodes:
        if not isinstance(node, ast.Call):
            continue
        func, attribute = node.func, None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            attribute, func = func.attr, func.value
        if not isinstance(func, ast.Name) or func.id not in bound:
            continue
        keywords = tuple(k.arg for k in node.keywords if k.arg is not None)
        text = ast.unparse(node)
        out.append(CallUse(consumer_file, node.lineno, bound[func.id], attribute, keywords,
                           text if len(text) <= 160 else text[:157] + "..."))
    return out


@dataclass(frozen=True)
class AttributeUse:
    """`alias.name` in a consumer, where alias is a provider module it imported."""

    consumer_file: Path
    line: int
    imported: ImportUse
    attribute: str

    @property
    def where(self) -> str:
        return f"{self.consumer_file}:{self.line}"


def attributes_of(consumer_file: Path, uses: list[ImportUse]) -> list[AttributeUse]:
    """Attribute reads of the names `uses` bound (`tl.program_id`, `dtypes.float4e2m1`), one per
    distinct (name, attribute), at its first line."""
    tree = parse(consumer_file)
    if tree is None:
        return []
    bound = {u.bound_as: u for u in uses}
    seen: dict[tuple[str, str], AttributeUse] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            key = (node.value.id, node.attr)
            if key not in seen or node.lineno < seen[key].line:
                seen[key] = AttributeUse(consumer_file, node.lineno, bound[node.value.id], node.attr)
    return sorted(seen.values(), key=lambda a: a.line)


def module_files(package: Package, dotted: str) -> list[tuple[Path, str]]:
    """(file, module name) of a module, or of every module under a package directory."""
    single = package.module_file(dotted)
    if package.is_package_dir(dotted):
        root = package.root.joinpath(*dotted.split(".")[1:])
        out = []
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(package.root).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.append((path, ".".join([package.name, *parts])))
        return out
    return [(single, dotted)] if single is not None else []
