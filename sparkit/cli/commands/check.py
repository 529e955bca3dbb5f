"""`sparkit check`: the startup checks again, against a run or any live server (--url with the
recipe it runs)."""

from __future__ import annotations

import typer

from sparkit.cli import options
from sparkit.cli.commands.up import render_checks
from sparkit.cli.common import print_json


def check(
    run: options.ServerRun = None,
    url: options.Url = None,
    recipe: str | None = typer.Option(None, "--recipe", metavar="RECIPE", help="With --url: the recipe whose expectations to check (--set overrides its keys)."),
    set_: options.Overrides = (),
    api_key: options.ApiKey = None,
    json_out: options.Json = False,
) -> None:
    from sparkit.checks.runner import run_activation_checks
    from sparkit.cli.common import require_server
    from sparkit.contract.checks import Status, worst
    from sparkit.contract.plan import LaunchPlan
    from sparkit.errors import CheckFailed, EngineError, UsageError
    from sparkit.runs import resolve_server

    target = resolve_server(run=run, url=url, api_key=api_key)
    if target.run is not None and not target.run.live:
        raise EngineError(
            f"run {target.run.id} is not running",
            hint="`sparkit status` lists the running servers; `sparkit up` starts one",
        )
    if target.run is not None:
        plan = LaunchPlan.load(target.run.plan_path)
        run_path = target.run.path
    elif recipe:
        from sparkit.planning.compile import compile_plan
        from sparkit.recipes.load import load_recipe

        plan = compile_plan(load_recipe(recipe, list(set_)))
        run_path = None
    else:
        raise UsageError("--url needs --recipe RECIPE: the checks compare the server with what a recipe asks for")
    require_server(target.url, target.api_key)  # unreachable: one message, not a table of failed checks
    results = run_activation_checks(target.url, plan, run_path, api_key=target.api_key)
    if json_out:
        print_json({"url": target.url, "run": target.run.id if target.run else None, "checks": [r.to_dict() for r in results]})
    else:
        render_checks(results, title=f"checks of {target.url}")
    if worst(results) == Status.FAIL:
        raise CheckFailed("startup check(s) failed: " + ", ".join(r.title for r in results if r.status == Status.FAIL))
