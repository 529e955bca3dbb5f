"""`sparkit verify`: the correctness gate of a recipe against a baseline (two servers, fixed
prompts, greedy), judged as the optimisations it adds require."""

from __future__ import annotations

import typer

from sparkit.cli import options
from sparkit.cli.commands.bench import progress_reporter
from sparkit.cli.common import console, print_json


def verify(
    recipe: str = typer.Argument(..., help="The candidate recipe."),
    against: str = typer.Option(..., "--against", metavar="RECIPE", help="The baseline (reference) recipe."),
    set_: options.Overrides = (),
    against_set: list[str] = typer.Option([], "--against-set", metavar="KEY=VALUE", help="Override for the baseline recipe."),
    rounding_changing: list[str] = typer.Option([], "--rounding-changing", metavar="KEY", help="Declare a rounding-changing optimisation not visible in the recipes (repeatable)."),
    num_prompts: int | None = typer.Option(None, "--num-prompts", help="Use the first N of the fixed prompts (default all 8)."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", "--max-tokens", help="Greedy tokens per prompt."),
    greedy_only: bool = typer.Option(False, "--greedy-only", help="Send no sampled request: skip the state-pollution re-run (SGLang's NEXTN without flashinfer dies on one)."),
    as_json: options.Json = False,
) -> None:
    from rich.table import Table

    from sparkit.bench.verify import run_verify
    from sparkit.errors import CheckFailed

    with progress_reporter() as on_progress:
        report = run_verify(recipe, against, recipe_overrides=set_, against_overrides=against_set,
                            declared_rounding=rounding_changing, num_prompts=num_prompts,
                            max_new_tokens=max_new_tokens, on_progress=on_progress, greedy_only=greedy_only)
    if as_json:
        print_json(report.to_dict())
    else:
        table = Table(title=f"verify {report.recipe} against {report.baseline}", title_justify="left")
        for column in ("check", "status", "detail"):
            table.add_column(column)
        colours = {"pass": "green", "warn": "yellow", "fail": "red", "skip": "dim"}
        for check in report.checks:
            status = check.status.value
            table.add_row(check.title, f"[{colours[status]}]{status}[/]", check.detail)
        console().print(table)
        if report.rounding_changes:
            console().print("rounding-changing: " + "; ".join(report.rounding_changes))
        for check in report.checks:
            for line in check.evidence:
                console().print(f"  {check.name}: {line}", highlight=False)
        console().print(report.summary, highlight=False, markup=False, soft_wrap=True)
    if not report.passed:
        failed = [c.name for c in report.checks if c.status.value == "fail"]
        raise CheckFailed(f"verify failed: {', '.join(failed)}", hint="see the table above (or --json) for where outputs differ")
