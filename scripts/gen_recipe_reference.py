"""Generate docs/recipe-reference.md from the recipe schema's field docstrings.

    python scripts/gen_recipe_reference.py          # write docs/recipe-reference.md
    python scripts/gen_recipe_reference.py --check  # exit 1 when the file is out of date
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "docs" / "recipe-reference.md"


def _type_text(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{v}`" for v in typing.get_args(annotation))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        parts = [a for a in typing.get_args(annotation) if a is not type(None)]
        text = " \\| ".join(_type_text(a) for a in parts)
        return text + " (optional)" if len(parts) < len(typing.get_args(annotation)) else text
    if origin in (list, dict):
        args = ", ".join(_type_text(a) for a in typing.get_args(annotation))
        return f"{origin.__name__}[{args}]"
    if isinstance(annotation, type):
        return "section" if hasattr(annotation, "model_fields") else annotation.__name__
    return str(annotation).replace("typing.", "")


def _default_text(info) -> str:
    from pydantic_core import PydanticUndefined

    if info.default is PydanticUndefined and info.default_factory is None:
        return "**required**"
    if info.default_factory is not None:
        value = info.default_factory()
        if hasattr(type(value), "model_fields"):
            return "(section defaults)"
        return f"`{value!r}`"
    return f"`{info.default!r}`" if info.default is not None else "unset"


def _section(model, prefix: str, lines: list[str]) -> None:
    from pydantic import BaseModel

    nested = []
    lines.append(f"### `{prefix or 'top level'}`\n")
    doc = (model.__doc__ or "").strip()
    if doc:
        lines.append(" ".join(doc.split()) + "\n")
    lines.append("| key | type | default | meaning |")
    lines.append("|---|---|---|---|")
    for name, info in model.model_fields.items():
        annotation = info.annotation
        sub = next((a for a in [annotation, *typing.get_args(annotation)]
                    if isinstance(a, type) and issubclass(a, BaseModel)), None)
        key = f"{prefix}.{name}" if prefix else name
        description = " ".join((info.description or "").split()).replace("|", "\\|")
        if (info.json_schema_extra or {}).get("changes_rounding"):
            description += " **Changes rounding**: `sparkit verify` judges a change of it by token agreement."
        lines.append(f"| `{key}` | {_type_text(annotation)} | {_default_text(info)} | {description} |")
        if sub is not None:
            nested.append((sub, key))
    lines.append("")
    for sub, key in nested:
        _section(sub, key, lines)


def _environment_section() -> list[str]:
    """The allowlist of each engine, the rule inside a family, and the variables known to load code."""
    from sparkit.contract.environment import KNOWN_CODE_ENV, KNOWN_CODE_ENV_PREFIXES, PATH_SUFFIXES
    from sparkit.engines.base import registry
    from sparkit.engines.sglang.adapter import REGISTRY_OTHER_NAMES, SGLANG_CODE_ENV, SGLangAdapter

    lines = [
        "## The engine's environment", "",
        "The engine starts with the environment of the `sparkit up` that starts it, and a recipe's `server.env`",
        "over it. A recipe may set the engine's own settings there: the families of variables its engine reads,",
        "below. Any other variable (OPENSSL_CONF, PATH, HOME, TMPDIR, HF_HOME, XDG_CACHE_HOME, LD_*, PYTHON*, ...)",
        "can make the engine load code the startup checks cannot tell from its own: it needs",
        "`server.allow_code_env` to name it (rule `code-env-needs-opt-in`), and `sparkit plan` and `sparkit up`'s",
        "preflight (`recipe environment`, also in `--json`) show every one a recipe lets in. So does a variable of a",
        "family whose name ends in " + ", ".join(f"`{s}`" for s in PATH_SUFFIXES) + " (it names a file,",
        "directory, library, module or program the engine reads), and each one in the table below.",
        "",
        "| engine | families (a prefix ends in `_`) |", "|---|---|",
    ]
    for name, adapter in registry().items():
        environment = SGLangAdapter.static_environment() if name == "sglang" else adapter.environment()
        families = "; ".join(f"{f.name}: " + ", ".join(f"`{p}*`" for p in f.prefixes)
                             + (" and the other names of its registry" if f.prefixes and f.names else "")
                             + (", ".join(f"`{n}`" for n in sorted(f.names)) if not f.prefixes else "")
                             for f in environment.families)
        lines.append(f"| `{name}` | {families} |")
    lines += ["", f"On SGLang, the registry is the installed sglang's `sglang.srt.environ.envs` (0.5.23's "
              f"{len(REGISTRY_OTHER_NAMES)} names outside `SGLANG_*` where sglang does not import).", "",
              "| variable | what it loads |", "|---|---|",
              *[f"| `{name}` | {why} |" for name, why in KNOWN_CODE_ENV.items()],
              *[f"| `{prefix}*` | {why} |" for prefix, why in KNOWN_CODE_ENV_PREFIXES.items()],
              *[f"| `{name}` (sglang) | {why} |" for name, why in SGLANG_CODE_ENV.items()], ""]
    return lines


def render() -> str:
    sys.path.insert(0, str(REPO))
    from sparkit.engines.base import registry
    from sparkit.planning.rules import general_rules
    from sparkit.recipes.load import MAX_EXTENDS_DEPTH
    from sparkit.recipes.schema import TARGETS, Recipe

    lines = [
        "# Recipe reference",
        "",
        "<!-- Generated by scripts/gen_recipe_reference.py from sparkit/recipes/schema.py; do not edit. -->",
        "",
        "A recipe is a YAML file. Unknown keys are errors. `extends` merges a base recipe under this one;",
        "`--set key.path=value` (value read as YAML) overrides on the command line.",
        "Precedence: command line > recipe > base > defaults.",
        "",
        "## Keys",
        "",
    ]
    _section(Recipe, "", lines)
    lines += [
        "## How recipe names resolve", "",
        "A recipe argument (`sparkit plan X`) or an `extends: X` is a **file** when X is written as a path:",
        "absolute, starting with `./`, `../` or `~`, or ending in `.yaml` / `.yml`. An `extends` path is",
        "relative to the directory of the recipe that says it (never the current directory), so",
        "`extends: tiny-sglang.yaml` in `recipes/tiny/` is `recipes/tiny/tiny-sglang.yaml` wherever sparkit runs.",
        "Anything else is a **shipped recipe's name**: `tiny` (or `tiny/tiny`), `ling-3.0-flash/spark-optimized`,",
        "or a file stem only one shipped recipe has (`spark-optimized`). A file lying beside the recipe (or,",
        "for a command-line argument, in the current directory) with that name does not replace the shipped",
        "recipe: planning warns that it is not used, and `./NAME` names it. On the command line only, a name",
        "no shipped recipe has may be a file in the current directory (`sparkit plan myrecipe`).",
        "`-` and `/dev/stdin` read the recipe from standard input (a pipe or a redirected file; its relative",
        f"`extends` resolve from the current directory). A chain of `extends` is at most {MAX_EXTENDS_DEPTH} recipes long.",
        "",
    ]
    lines += _environment_section()
    lines += ["## Targets", "", "| target | GPUs | compute capability | memory | description |", "|---|---|---|---|---|"]
    for t in TARGETS.values():
        cc = f"sm_{t.cc_exact[0]}{t.cc_exact[1]}" if t.cc_exact else ", ".join(f"sm_{m}x" for m in t.cc_majors) or "any"
        lines.append(f"| `{t.name}` | {t.gpu_count or '-'} | {cc} | {t.memory} | {t.description} |")
    lines += ["", "## Rules", "", "| rule | why | fix |", "|---|---|---|"]
    for r in general_rules():
        lines.append(f"| `{r.name}` | {r.reason} | {r.fix} |")
    for name, adapter in registry().items():
        for r in adapter.rules():
            lines.append(f"| `{r.name}` ({name} only) | {r.reason} | {r.fix} |")
    lines += ["", "The sglang adapter also rejects pass-through flags the installed sglang's parser does not accept",
              "(e.g. `--cuda-graph-max-bs` in 0.5.23) and flags that a recipe key already sets, and warns about",
              "`SGLANG_*` variables missing from the installed `sglang.srt.environ.envs` registry.", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from _generated_doc import write_or_check

    return write_or_check(OUTPUT, render(), argv, repo=REPO, script="gen_recipe_reference.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
