"""`sparkit recipes list | show | validate`: the shipped recipes, one fully resolved, each checked."""

from __future__ import annotations

from pathlib import Path

import typer

from sparkit.cli import options
from sparkit.cli.command_tree import SparkitTyper
from sparkit.cli.common import console, err_console, print_json

recipes_app = SparkitTyper(no_args_is_help=True)


@recipes_app.command("list")
def list_cmd(as_json: options.Json = False) -> None:
    """The shipped recipes, one line each."""
    rows = []
    for name, path in _shipped():
        description = _description(path)
        rows.append({"name": name, "path": str(path), "description": description})
    if as_json:
        print_json(rows)
        return
    from rich.markup import escape

    width = max((len(r["name"]) for r in rows), default=0)
    for r in rows:
        console().print(f"{escape(r['name']).ljust(width)}  [dim]{escape(r['description'] or '')}[/]",
                        highlight=False, soft_wrap=True)


def _shipped():
    from sparkit.recipes.load import shipped_recipes

    return shipped_recipes()


def _description(path: Path) -> str | None:
    """The description key, read without validation (listing must never fail)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return "(unreadable)"
    return data.get("description") if isinstance(data, dict) else None


@recipes_app.command("show")
def show_cmd(
    recipe: str = typer.Argument(..., help="Recipe file or shipped name."),
    set_: options.Overrides = (),
    as_json: options.Json = False,
) -> None:
    """A recipe fully resolved (after extends, overrides and defaults)."""
    from sparkit.recipes.load import display_path, load_recipe

    loaded = load_recipe(recipe, list(set_))
    data = loaded.resolved()
    if as_json:
        print_json({"name": loaded.name, "path": str(loaded.path), "chain": [str(p) for p in loaded.chain],
                    "recipe": data})
        return
    import sys

    import yaml

    # Plain YAML, never rich: `recipes show X > mine.yaml` must load back as a recipe. Every key
    # is resolved already, so `extends` would only re-read the base (from a path relative to
    # wherever the file lands): the chain is kept as a comment instead.
    data.pop("extends", None)
    chain = " <- ".join(str(display_path(p)) for p in loaded.chain)
    header = f"# {loaded.name}: {chain}\n"
    if loaded.overrides:
        header += "# with " + " ".join(f"--set {o}" for o in loaded.overrides) + "\n"
    sys.stdout.write(header + yaml.safe_dump(data, sort_keys=False, width=1000))
    sys.stdout.flush()


@recipes_app.command("validate")
def validate_cmd(
    files: list[str] = typer.Argument(None, help="Recipe files (or shipped names); none: every shipped recipe."),
    as_json: options.Json = False,
) -> None:
    """Load, check the rules and compile each recipe (every shipped one without FILES); exit 3 if any is invalid."""
    from sparkit.errors import RecipeError, SparkitError
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    if not files:
        files = [name for name, _path in _shipped()]
        err_console().print(f"validating the {len(files)} shipped recipes", highlight=False)
    results = []
    for ref in files:
        try:
            plan = compile_plan(load_recipe(ref))
            results.append({"recipe": ref, "ok": True, "warnings": plan.warnings, "error": None})
        except SparkitError as exc:
            results.append({"recipe": ref, "ok": False, "warnings": [], "error": str(exc)})
    if as_json:
        print_json(results)
    else:
        from rich.markup import escape

        for r in results:
            if r["ok"]:
                console().print(f"[green]ok[/]    {escape(r['recipe'])}")
                for w in r["warnings"]:
                    console().print(f"      [yellow]warning:[/] {escape(w)}", soft_wrap=True)
            else:
                console().print(f"[bold red]error[/] {escape(r['error'])}", soft_wrap=True)
    if not all(r["ok"] for r in results):
        raise typer.Exit(RecipeError.exit_code)
