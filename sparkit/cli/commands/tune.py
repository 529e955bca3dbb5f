"""`sparkit tune`: sweep recipe values one server at a time (A/B/A), rank the points, write the
best as a new recipe file; every file it writes is said before any server starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from sparkit.cli import options
from sparkit.cli.commands.bench import _default_out, _fmt, progress_reporter
from sparkit.cli.common import console, err_console, print_json, writable_dir, writable_file


def render_sweep(doc: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from sparkit.bench.tune_params import point_label

    ranking = doc.get("ranking") or {}
    order = ranking.get("order") or []
    best = ranking.get("best")
    cfg = doc.get("bench_config", {})
    table = Table(
        title=f"tune {doc.get('recipe_name')}: {cfg.get('dataset')} {cfg.get('input_len')} in / {cfg.get('output_len')} out, "
        f"{cfg.get('num_prompts')} prompts",
        title_justify="left",
    )
    for column in ("point", "accept length", "mean TPOT ms", "step time ms (est.)", "tok/s", "rank"):
        table.add_column(column, justify="left" if column == "point" else "right")
    for index, point in enumerate(doc.get("points", [])):
        label = escape(point_label(point["values"]))
        f = point.get("figures") or {}
        if point.get("status") != "done":
            table.add_row(label, "-", "-", "-", "-", point.get("status", "?") + (f": {point['error'][:60]}" if point.get("error") else ""))
            continue
        position = order.index(index) + 1 if index in order else "-"
        mark = f"[bold green]{position} (best)[/]" if index == best else str(position)
        why = (ranking.get("rejected") or {}).get(point_label(point["values"]))
        if why:
            mark = f"[bold red]rejected: {escape(why)}[/]"
        table.add_row(
            label, _fmt(f.get("accept_length_mean")), _fmt(f.get("tpot_mean_ms"), 3),
            _fmt(f.get("step_time_estimate_ms"), 3), _fmt(f.get("output_throughput_tok_s"), 1), mark,
        )
    console().print(table)
    if ranking.get("verdict"):
        console().print(ranking["verdict"], markup=False, highlight=False)
    if doc.get("run_order"):
        drift = ranking.get("drift_ms")
        console().print("order: " + " -> ".join(doc["run_order"]) + (
            f" (the baseline moved {drift:+.3f} ms TPOT between its runs)" if drift is not None else ""),
            markup=False, highlight=False, soft_wrap=True)
    rate = ("output tokens / the time that point's own requests took (interleaved run)" if doc.get("interleaved")
            else "output tokens / wall time")
    console().print(f"step time = mean TPOT x mean accept length (an estimate, not a measurement); tok/s = {rate}.")


def _say_what_tune_does(loaded: Any, config: Any, why: str, out_path: Path, write_recipe_dir: Path | None,
                        no_recipe: bool, interleave: bool) -> None:
    """Up front, before any server starts: the workload, the order, and every file the sweep will write."""
    from sparkit.bench.tune import INTERLEAVED_WARNING, tuned_recipe_dir

    say = err_console().print
    say(f"workload: {config.dataset}, {config.input_len} tokens in / {config.output_len} out, {config.num_prompts} "
        f"prompts per point{why}", highlight=False, soft_wrap=True)
    say(f"writes: the sweep to {out_path} (rewritten as points finish; rerun to resume)", highlight=False, soft_wrap=True)
    if interleave:
        say(f"[bold yellow]warning:[/] {INTERLEAVED_WARNING}", highlight=False, soft_wrap=True)
    else:
        say("order: one server at a time, A/B/A (the first point, every other point, the first point again: its drift "
            "is part of the noise band); a point that changes greedy outputs or fails a startup check is rejected",
            highlight=False, soft_wrap=True)
    if no_recipe or loaded.path is None:
        say("writes no recipe file" + ("" if no_recipe else f": {loaded.name} is not a file"), highlight=False)
    else:
        where, reason = tuned_recipe_dir(Path(loaded.path), write_recipe_dir)
        say(f"writes: the best point's recipe as a new file {Path(where).resolve()}/{Path(loaded.path).stem}-tuned-"
            f"<point>.yaml ({reason}; --recipe-dir DIR puts it elsewhere, --no-recipe writes none)",
            highlight=False, soft_wrap=True)


def tune(
    recipe: str = typer.Argument(..., help="Recipe file or shipped name to sweep."),
    param: list[str] = typer.Option(..., "--param", metavar="KEY=V1,V2,...", help="KEY=V1,V2,... (a recipe key: speculative.num_steps=1,2,3,4), "
                                    "env.NAME=V1,V2 (an engine environment variable), flag.--name=V1,V2 or a bare "
                                    "flag.--name (an engine flag: off and on). Repeatable: a grid."),
    set_: options.Overrides = (),
    out: Path | None = typer.Option(None, "--out", metavar="FILE", help="Sweep JSON (rewritten after each point; rerun to resume)."),
    write_recipe_dir: Path | None = typer.Option(None, "--recipe-dir", metavar="DIR", help="Where to write the best recipe (default: beside the recipe; the current directory for a shipped one)."),
    no_recipe: bool = typer.Option(False, "--no-recipe", help="Write no recipe file, only the sweep's results."),
    input_len: int | None = typer.Option(None, "--input-len", min=1, help="Prompt tokens per request (default: 3/8 of the context the model was made for, at most 1024; tiny-ling 48)."),
    output_len: int | None = typer.Option(None, "--output-len", min=1, help="Output tokens per request (default: half that context, at most 256; tiny-ling 64)."),
    num_prompts: int = typer.Option(8, "--num-prompts", help="Measured requests per point."),
    dataset: str | None = typer.Option(None, "--dataset", metavar="DATASET", help="profile:mixed (the default: code, prose, math and chat text in turn) | profile:KIND (e.g. profile:math) | random | gsm8k | FILE."),
    warmup: int = typer.Option(1, "--warmup", help="Unmeasured requests before each point."),
    seed: options.PromptSeed = 0,
    repeats: int = typer.Option(1, "--repeats", help="Repeat the interleaved round to measure run-to-run noise."),
    interleave: bool = typer.Option(False, "--interleave", help="Every point's server up at once, benchmarked interleaved "
                                    "(unsound at batch 1 on one machine: said loudly). Default: one server at a time, A/B/A."),
    sequential: bool = typer.Option(True, "--sequential", hidden=True, help="One server at a time, A/B/A (the default)."),
    as_json: options.Json = False,
) -> None:
    from rich.markup import escape

    from sparkit.bench.runner import BenchConfig
    from sparkit.bench.tune import planned_points, run_tune
    from sparkit.bench.workload import TUNE_DATASET, model_context, tune_shape
    from sparkit.errors import UsageError
    from sparkit.recipes.load import load_recipe

    planned_points(recipe, param, list(set_))  # usage errors and flags the engine lacks, before anything starts
    if no_recipe and write_recipe_dir is not None:
        raise UsageError("--no-recipe writes no recipe, so --recipe-dir has nothing to place")
    loaded = load_recipe(recipe, list(set_))
    context = model_context(loaded.recipe)
    shape = tune_shape(context)
    chosen = (dataset or TUNE_DATASET, input_len or shape[0], output_len or shape[1])
    if context is not None and chosen[1] + chosen[2] > context.tokens:
        err_console().print(f"[yellow]warning:[/] {chosen[1]} + {chosen[2]} tokens per request exceed the "
                            f"{context.tokens} the model was made for ({context.why}): the ranking may not hold for "
                            "the text it serves", highlight=False, soft_wrap=True)
    config = BenchConfig(input_len=chosen[1], output_len=chosen[2], num_prompts=num_prompts, dataset=chosen[0],
                         warmup=warmup, seed=seed, repeats=repeats)
    out_path = writable_file(out, "--out") or _default_out(f"tune-{Path(recipe).stem}")
    write_recipe_dir = writable_dir(write_recipe_dir, "--recipe-dir")
    why = f" ({context.why})" if context is not None and (input_len is None or output_len is None) else ""
    _say_what_tune_does(loaded, config, why, out_path, write_recipe_dir, no_recipe, interleave)

    def said(point: Any, index: int, total: int) -> None:
        f = point.figures or {}
        err_console().print(
            f"[{index + 1}/{total}] {point.label}: {point.status}"
            + (f", TPOT {_fmt(f.get('tpot_mean_ms'), 3)} ms, accept {_fmt(f.get('accept_length_mean'))}" if point.status == "done" else f" {point.error or ''}")
            + (f" [bold red](rejected: {escape(point.rejected)})[/]" if point.status == "done" and point.rejected else "")
        )

    with progress_reporter() as on_progress:
        doc = run_tune(recipe, param, config, out_path=out_path, base_overrides=set_,
                       write_recipe_dir=write_recipe_dir, write_recipe=not no_recipe, on_point=said,
                       on_progress=on_progress, interleave=interleave)
    err_console().print(f"sweep saved to {out_path}", highlight=False, soft_wrap=True)
    for warning in doc.get("warnings") or []:
        err_console().print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    if doc.get("best_recipe"):  # on stderr in both modes: where a new file appeared is never a surprise
        err_console().print(f"best recipe written to {doc['best_recipe']} ({doc.get('best_recipe_where')})",
                            highlight=False, soft_wrap=True)
    elif doc.get("ranking") and not no_recipe:
        err_console().print("no recipe written: no point finished", highlight=False)
    if as_json:
        print_json(doc)
    else:
        render_sweep(doc)
