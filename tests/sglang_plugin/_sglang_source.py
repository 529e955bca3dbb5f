"""Read the installed sglang's source without importing its (GPU-only) modules.

Most of sglang.srt cannot be imported on a CPU-only machine (it pulls tvm_ffi, torchvision,
CUDA kernels). These helpers find a module's file inside the installed package and look
classes, methods and functions up in its AST, or exec a pure-Python function from it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path


def sglang_root() -> Path:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.origin, "sglang is not installed"
    return Path(spec.origin).parent


def module_path(module: str) -> Path:
    parts = module.split(".")
    assert parts[0] == "sglang"
    base = sglang_root().joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{module} is not in the installed sglang ({base})")


def module_ast(module: str) -> ast.Module:
    return ast.parse(module_path(module).read_text())


def find_class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def find_function(body, name: str):
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def resolve_statically(dotted: str) -> str:
    """Find module.Class.method (or module.function) in the source; returns how it resolved."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        try:
            tree = module_ast(module)
        except (FileNotFoundError, AssertionError):
            continue
        rest = parts[cut:]
        body = tree.body
        for i, name in enumerate(rest):
            last = i == len(rest) - 1
            cls = find_class(ast.Module(body=body, type_ignores=[]), name)
            if cls is not None and not last:
                body = cls.body
                continue
            fn = find_function(body, name)
            if last and (fn is not None or cls is not None):
                return f"source: {module_path(module)}"
            raise AssertionError(f"{dotted}: {name!r} not found in {module_path(module)}")
    raise AssertionError(f"{dotted}: no module of that path in the installed sglang")


def resolve(dotted: str):
    """importlib + getattr when the module imports on this machine, else the source lookup."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("sglang"):
                continue  # not a module at this depth
            return resolve_statically(dotted)  # a GPU-only dependency is missing here
        except Exception:
            return resolve_statically(dotted)
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                raise AssertionError(f"{dotted}: {type(obj).__name__} {obj!r} has no {attr!r}")
            obj = getattr(obj, attr)
        return obj
    raise AssertionError(f"{dotted} does not resolve")


def exec_functions(module: str, names: list[str], namespace: dict) -> dict:
    """Exec the named top-level functions, classes and assignments of a module's source in namespace."""
    tree = module_ast(module)
    wanted = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            wanted.append(node)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in names for t in node.targets):
            wanted.append(node)
    found = {n.name if isinstance(n, (ast.FunctionDef, ast.ClassDef)) else n.targets[0].id for n in wanted}
    missing = set(names) - found
    assert not missing, f"{module}: {sorted(missing)} not found"
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(module_path(module)), "exec"), namespace)
    return namespace


def method_source(module: str, cls: str, method: str) -> str:
    tree = module_ast(module)
    node = find_class(tree, cls)
    assert node is not None, f"{module}.{cls} not found"
    fn = find_function(node.body, method)
    assert fn is not None, f"{module}.{cls}.{method} not found"
    return ast.get_source_segment(module_path(module).read_text(), fn)


def bind_method(module: str, cls: str, method: str, namespace: dict, strip_imports: bool = False):
    """The installed source of cls.method, exec'd as a plain function in namespace.
    `strip_imports`: drop the method's own one-line `from sglang... import X` statements (GPU-only
    modules on this machine); the namespace supplies those names."""
    import textwrap

    src = textwrap.dedent(method_source(module, cls, method))
    # Drop decorators such as @torch.no_grad() that need the real torch namespace.
    lines = [ln for ln in src.splitlines() if not ln.lstrip().startswith("@")]
    if strip_imports:
        import re

        single = re.compile(r"^\s*from sglang\.[\w.]+ import [\w, ]+$")
        lines = [ln for ln in lines if not single.match(ln)]
    ns = dict(namespace)
    exec(compile("\n".join(lines), str(module_path(module)), "exec"), ns)
    return ns[method]
