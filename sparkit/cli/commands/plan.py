"""`sparkit plan`: the exact engine launch a recipe compiles to, its decode-speed roofline and its
memory fit on this host; no GPU needed."""

from __future__ import annotations

import typer

from sparkit.cli import options
from sparkit.cli.common import console, err_console, print_json


def plan_cmd(
    recipe: str = typer.Argument(..., help="Recipe file or shipped name (see `sparkit recipes list`)."),
    set_: options.Overrides = (),
    port: int | None = typer.Option(None, "--port", metavar="PORT", help="Port to plan for (default: the recipe's).", min=1, max=65535),
    as_json: options.Json = False,
    strict: bool = typer.Option(False, "--strict", help="Fail (exit 4) when the engine's own parser cannot validate the plan here."),
    context: int | None = typer.Option(None, "--context", metavar="TOKENS", min=1, help="Tokens of context for the roofline's KV / state reads (default 8192, or the model's limit)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="The roofline's arithmetic: bytes by component, tok/s by accept length."),
) -> None:
    from sparkit.errors import PreflightError
    from sparkit.host import detect_host
    from sparkit.memory.fit import compute_fit, memory_basis
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe
    from sparkit.roofline.estimate import roofline_document

    loaded = load_recipe(recipe, list(set_))
    plan = compile_plan(loaded, port=port)
    if strict and plan.validated_by is None:
        raise PreflightError(plan.validation_note or "the plan could not be validated by the engine's parser",
                             hint=_validation_hint(plan))
    roofline = roofline_document(loaded.recipe, recipe_name=loaded.name, context=context)
    fit = compute_fit(plan, memory_basis(plan, detect_host()))
    if as_json:
        print_json({**plan.to_dict(), "roofline": roofline, "memory_fit": fit.to_dict()})
        return
    render_plan(plan)
    from sparkit.cli.roofline_view import render_roofline

    render_roofline(console(), roofline, verbose=verbose)
    render_fit(fit)


_VERDICT_STYLE = {"fits": "green", "fits-with": "yellow", "does-not-fit": "bold red", "unknown": "yellow"}


def render_fit(fit) -> None:
    """The memory fit: every term, the arithmetic, the verdict."""
    from rich.markup import escape

    from sparkit.memory.units import gib

    out = console()
    out.print(f"\n[bold {_VERDICT_STYLE[fit.verdict]}]memory fit[/]: {escape(fit.summary)}", highlight=False, soft_wrap=True)
    out.print(f"  checkpoint: {escape(fit.checkpoint_note)}", highlight=False, soft_wrap=True)
    if fit.basis is not None:
        out.print(f"  memory: {escape(fit.basis.source)}", highlight=False, soft_wrap=True)
    group = None
    for term in fit.terms:  # two lines a term: figures aligned, then how it was computed
        label = term.group if term.group != group else ""
        group = term.group
        out.print(f"  {label:8} {gib(term.bytes):>10}  {escape(term.name)}", highlight=False, soft_wrap=True)
        out.print(f"  {'':8} {'':>10}  [dim]{escape(term.detail)}[/]", highlight=False, soft_wrap=True)
    for line in fit.arithmetic:
        out.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
    for note in fit.notes:
        out.print(f"  [dim]note: {escape(note)}[/]", highlight=False, soft_wrap=True)
    if fit.need:
        out.print(f"  [yellow]needs:[/] {escape(fit.need)}", highlight=False, soft_wrap=True)


def render_plan(plan) -> None:
    from rich.markup import escape
    from rich.table import Table

    out = console()
    out.print(f"[bold]{escape(plan.recipe_name)}[/] ({plan.engine}) -> {plan.url}  model {escape(plan.model)}")
    out.print("\n[bold]command[/]")
    # Plain print: the line must paste into a shell exactly (no wrapping, no markup).
    out.print(plan.command_line(), markup=False, highlight=False, soft_wrap=True)
    if plan.env:
        out.print("\n[bold]environment[/]")
        # One print: a recipe may set thousands of variables, and rich lays out each call.
        lines = [f"  {k}={v}" + ("   # outside the engine's settings, allowed by server.allow_code_env" if k in plan.code_env
                                 else "") for k, v in sorted(plan.env.items())]
        out.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
    table = Table(title="which path provides each optimisation", title_justify="left")
    table.add_column("optimisation")
    table.add_column("provider")
    table.add_column("detail", overflow="fold")
    for p in plan.provisions:
        table.add_row(escape(p.optimisation), escape(p.provider), escape(p.detail))
    out.print()
    out.print(table)
    exp = {k: v for k, v in plan.expectations.__dict__.items() if v not in (None, {}, []) and k != "server_args"}
    exp.update({f"server_args.{k}": v for k, v in plan.expectations.server_args.items()})
    out.print("\n[bold]expectations (verified by the startup checks)[/]")
    for k, v in exp.items():
        out.print(f"  {k}: {v}", markup=False, highlight=False)
    if plan.model_builds:
        out.print("\n[bold]built before launch[/]")
        for b in plan.model_builds:
            out.print(f"  {b['name']} seed {b['seed']} -> {b['dir']}", markup=False)
            export = b.get("export_hf")
            if export:
                layout = export.get("weights", "bf16") + (", one scale damaged on purpose" if export.get("damaged_scale") else "")
                out.print(f"    exported ({layout}) -> {export['dir']}", markup=False)
    for w in plan.warnings:
        err_console().print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
    if plan.validated_by:
        out.print(f"\nvalidated by {escape(plan.validated_by)}", highlight=False)
    else:
        err_console().print(f"[yellow]note:[/] {escape(plan.validation_note or 'not validated')}", soft_wrap=True)
        err_console().print(f"[yellow]hint:[/] {escape(_validation_hint(plan))}", soft_wrap=True)


def _validation_hint(plan) -> str:
    from sparkit.engines.base import get_adapter

    how = get_adapter(plan.engine).validation_hint or "install the engine's package"
    return f"to validate here: {how}; `--strict` makes this an error"
