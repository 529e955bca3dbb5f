"""`sparkit bench`, `sparkit bench compare`, `sparkit tune`, `sparkit verify`: parse, call
sparkit.bench, render. Progress goes to stderr; --json prints one document on stdout."""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import typer
from typer.core import TyperGroup

from sparkit.cli.common import console, err_console, print_json, run_async, writable_dir, writable_file


class _BenchGroup(TyperGroup):
    """`bench [RUN] [options]` runs the benchmark; `bench compare A B` is a sub-command.

    Click would read `compare` as the optional RUN argument, so a known
    sub-command name is routed before the group's own arguments are parsed."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] in self.commands:
            click.Command.parse_args(self, ctx, [])
            ctx._protected_args, ctx.args = args[:1], args[1:]  # what Group.parse_args sets
            return ctx.args
        # `bench RUN --input-len 5`: options may follow RUN, as for a plain command.
        ctx.allow_interspersed_args = True
        click.Command.parse_args(self, ctx, args)
        if ctx.args:
            from sparkit.errors import UsageError

            raise UsageError(f"sparkit bench: unexpected argument(s): {' '.join(ctx.args)}",
                             hint="bench takes one RUN (or --url); `sparkit bench compare A.json B.json` compares results")
        return ctx.args


bench_app = typer.Typer(
    cls=_BenchGroup,
    invoke_without_command=True,
    no_args_is_help=False,
    add_completion=False,
    help="Batch-1 decode benchmark (TPOT, TTFT, ITL, throughput, accept length, step-time estimate).",
)


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


@contextlib.contextmanager
def progress_reporter(enabled: bool = True) -> Iterator[Any]:
    """A (phase, done, total) callback: a rich progress bar on a terminal's stderr, else a line
    per finished request (ProgressLines), so a CI log shows the benchmark moving."""
    import sys

    from sparkit.cli.common import ProgressLines, is_terminal

    if not enabled:
        yield lambda phase, done, total: None
        return
    if not is_terminal(sys.stderr):
        yield ProgressLines().update
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err_console(), transient=False,
    ) as bar:
        tasks: dict[str, Any] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        yield update


def _default_out(label: str) -> Path:
    from sparkit.paths import data_dir

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in label)[:60] or "server"
    return data_dir() / "bench" / f"{stamp}-{safe}.json"


def render_bench(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from sparkit.bench.runner import HEADLINE

    summary = doc.get("summary", {})
    n = summary.get("repeats", 0)
    workload = doc.get("workload") or {}
    table = Table(title=f"bench: {workload.get('description', '')}", title_justify="left")
    table.add_column("figure", overflow="fold")
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("unit")
    if n > 1:
        table.add_column(f"stdev over {n} repeats", justify="right")
    for key, unit, _ in HEADLINE:
        row = [key, _fmt(summary.get("figures", {}).get(key)), unit]
        if n > 1:
            row.append(_fmt(summary.get("stdev", {}).get(key), 3))
        table.add_row(*row)
    console().print(table)
    last = next((r for r in reversed(doc.get("repeats", [])) if r.get("complete")), None)
    if last:
        m, c = last["metrics"], last.get("server_counters", {})
        console().print(
            f"{m['completed']} requests, {m['total_output_tokens']} output tokens in {_fmt(m['duration_s'])} s"
            f" (server counted {_fmt(c.get('generation_tokens'), 0)}); "
            "TPOT excludes TTFT; peak = max over fixed 1-s windows (a window statistic); "
            "step time = mean TPOT x mean accept length (an estimate)."
        )
        for note in m.get("notes", []):
            console().print(f"[yellow]note:[/] {note}")
    from sparkit.bench.limit import limit_sentence

    limit = doc.get("limit")
    if limit:
        console().print(limit_sentence(limit), highlight=False, markup=False, soft_wrap=True)
    elif doc.get("server", {}).get("run_id") is None:
        console().print("no bandwidth limit: the server's recipe is unknown (--recipe names it)", highlight=False)


@bench_app.callback()
def bench(
    ctx: typer.Context,
    run: str | None = typer.Argument(None, help="Run id or recipe name of a started server (default: the latest live run)."),
    url: str | None = typer.Option(None, "--url", help="Benchmark this server instead of a run."),
    api_key: str | None = typer.Option(None, "--api-key", help="Bearer key to send (default: a run's key, from its recipe's server.api_key_env; else $SPARKIT_API_KEY for a --url server sparkit did not start)."),
    recipe_ref: str | None = typer.Option(None, "--recipe", help="The recipe the --url server runs (for its bandwidth limit; a run knows its own)."),
    set_: list[str] = typer.Option([], "--set", help="Override a key of --recipe (KEY=VALUE, as for plan)."),
    input_len: int = typer.Option(8192, "--input-len", help="Prompt tokens per request (random dataset)."),
    output_len: int = typer.Option(1024, "--output-len", help="Output tokens per request (ignore_eos)."),
    num_prompts: int = typer.Option(10, "--num-prompts", help="Measured requests per repeat."),
    concurrency: int = typer.Option(1, "--concurrency", help="Requests in flight at once."),
    dataset: str = typer.Option("random", "--dataset", help="random | gsm8k | profile:KIND (code, prose, math, chat, repetitive: sparkit's texts cut to --input-len tokens) | path to a .jsonl/.txt prompt file."),
    warmup: int = typer.Option(1, "--warmup", help="Unmeasured requests before each repeat."),
    seed: int = typer.Option(0, "--seed", help="Seed for the random prompts."),
    out: Path | None = typer.Option(None, "--out", help="Result JSON (written as it goes; rerun to resume). Default: under the data dir."),
    repeats: int = typer.Option(1, "--repeats", help="Repeat the whole benchmark to measure run-to-run noise."),
    as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout (progress and messages on stderr)."),
) -> None:
    """Benchmark a live server: greedy, ignore_eos, concurrency 1 by default."""
    if ctx.invoked_subcommand is not None:
        return
    from sparkit.bench.runner import BenchConfig, run_bench
    from sparkit.errors import UsageError
    from sparkit.runs import RunFiles, resolve_server

    for name, value in (("--num-prompts", num_prompts), ("--concurrency", concurrency), ("--repeats", repeats)):
        if value < 1:
            raise UsageError(f"{name} must be at least 1 (got {value})")
    if warmup < 0:
        raise UsageError(f"--warmup must be 0 or more (got {warmup})")
    try:
        target = resolve_server(run, url, api_key)
    except UsageError as exc:
        import difflib

        if run and difflib.get_close_matches(run, list(ctx.command.commands), n=1):  # `bench comapre a b`
            raise UsageError(exc.message, hint=f"did you mean `sparkit bench compare`? ({exc.hint})") from None
        raise
    recipe, run_id, label = None, None, "url"
    if target.run is not None:
        run_id = target.run.id
        plan = target.run.read_json(RunFiles.PLAN) or {}
        recipe = plan.get("recipe") or None
        label = plan.get("recipe_name") or run_id
    if recipe_ref is not None:
        from sparkit.recipes.load import load_recipe

        loaded = load_recipe(recipe_ref, list(set_))
        recipe, label = loaded.resolved(), loaded.name
    elif set_:
        raise UsageError("--set needs --recipe", hint="e.g. --recipe tiny --set stack.speculative=none")
    config = BenchConfig(
        input_len=input_len, output_len=output_len, num_prompts=num_prompts, concurrency=concurrency,
        dataset=dataset, warmup=warmup, seed=seed, repeats=repeats,
    )
    out_path = writable_file(out, "--out") or _default_out(label)
    from sparkit.cli.common import require_server

    require_server(target.url, target.api_key)  # after the usage checks, before a results file or a progress bar
    from sparkit.cli.common import resume_command, say, signals_as_interrupt

    signals_as_interrupt()  # SIGTERM and SIGHUP too: what was measured is kept and the hint is said
    try:
        with progress_reporter() as on_progress:
            doc = run_async(
                run_bench(target.url, config, api_key=target.api_key, out_path=out_path, recipe=recipe, run_id=run_id, on_progress=on_progress)
            )
    except KeyboardInterrupt:
        if out_path.exists():
            say(err_console(), f"interrupted; the requests measured so far are saved in {out_path}\n  resume with: "
                f"{resume_command('--out', str(out_path))}", highlight=False, soft_wrap=True)
        raise
    err_console().print(f"saved {out_path}")
    _raise_if_nothing_measured(doc, url=target.url)
    if as_json:
        print_json(doc)
    else:
        render_bench(doc)


def _raise_if_nothing_measured(doc: dict[str, Any], url: str) -> None:
    """A benchmark whose every request failed has no figures: exit 7 with the server's error,
    not an empty table and exit 0."""
    from sparkit.errors import EngineError

    requests = [r for rep in doc.get("repeats", []) for r in rep.get("requests", [])]
    errors = [r["error"] for r in requests if r.get("error")]
    if requests and len(errors) == len(requests):
        raise EngineError(
            f"all {len(requests)} benchmark request(s) to {url} failed; the first: {errors[0]}",
            hint="--input-len + --output-len must fit the model's context (tiny-ling: 2048 tokens), "
            "e.g. --input-len 512 --output-len 256"
            if "context length" in errors[0]
            else "`sparkit logs` shows the server's side",
        )


@bench_app.command("compare")
def compare(
    a: Path = typer.Argument(..., help="Baseline result JSON (A)."),
    b: Path = typer.Argument(..., help="Candidate result JSON (B)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout (progress and messages on stderr)."),
) -> None:
    """Side by side with ratios (B/A) and whether each difference exceeds run-to-run noise."""
    from rich.table import Table

    from sparkit.bench.compare import compare_results
    from sparkit.bench.runner import load_result

    comparison = compare_results(load_result(a), load_result(b), a_label=a.name, b_label=b.name)
    if as_json:
        print_json(comparison.to_dict())
        return
    table = Table(title=f"A = {comparison.a_label} ({comparison.a_repeats} repeats), B = {comparison.b_label} ({comparison.b_repeats} repeats)", title_justify="left")
    for column in ("figure", "A", "B", "B/A", "noise (+-)", "verdict"):
        table.add_column(column, justify="left" if column in ("figure", "verdict") else "right",
                         no_wrap=column != "figure", overflow="fold")
    colours = {"better": "green", "worse": "red"}
    for f in comparison.figures:
        verdict = f"[{colours[f.verdict]}]{f.verdict}[/]" if f.verdict in colours else f.verdict
        table.add_row(f.key, _fmt(f.a), _fmt(f.b), _fmt(f.ratio, 3), _fmt(f.noise, 3), verdict)
    console().print(table)
    for note in comparison.notes:
        console().print(f"note: {note}")


@bench_app.command("profile")
def profile(
    recipe: str = typer.Argument(..., help="Recipe with speculative decoding (file or shipped name)."),
    set_: list[str] = typer.Option([], "--set", help="Override a recipe key for both servers (KEY=VALUE)."),
    kinds: str | None = typer.Option(None, "--kinds", help="Comma-separated kinds of text (default all: code,prose,math,chat,repetitive)."),
    depths: str | None = typer.Option(None, "--depths", help="Comma-separated prompt lengths in tokens (default 256,2048; tiny-ling 32,96)."),
    prompts: int = typer.Option(4, "--prompts", min=1, help="Prompts per cell (kind x depth)."),
    output_len: int | None = typer.Option(None, "--output-len", min=2, help="Output tokens per request (default 128; tiny-ling 32)."),
    warmup: int = typer.Option(1, "--warmup", min=0, help="Unmeasured requests to each server first."),
    seed: int = typer.Option(0, "--seed", help="Which passages the prompts start at."),
    sequential: bool = typer.Option(False, "--sequential", help="One server after the other instead of both up, interleaved (for a model that fits once)."),
    out: Path | None = typer.Option(None, "--out", help="Profile JSON (default: under the data dir)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout (progress and messages on stderr)."),
) -> None:
    """Where speculative decoding pays: the recipe with and without it over code, prose, math,
    chat and repetitive text at several depths; accept length, tok/s and speed-up per cell, a
    verdict per kind."""
    from sparkit.bench.profile import KINDS, ProfileConfig, default_shape, run_profile
    from sparkit.errors import UsageError
    from sparkit.recipes.load import load_recipe

    chosen = [k.strip() for k in kinds.split(",") if k.strip()] if kinds else list(KINDS)
    unknown = [k for k in chosen if k not in KINDS]
    if unknown or not chosen:
        raise UsageError(f"--kinds {kinds!r}: unknown kind(s) {', '.join(unknown) or '(none given)'}",
                         hint=f"kinds: {','.join(KINDS)}")
    default_depths, default_out, why = default_shape(load_recipe(recipe, list(set_)).recipe)
    try:
        chosen_depths = [int(d) for d in depths.split(",") if d.strip()] if depths else default_depths
    except ValueError:
        raise UsageError(f"--depths {depths!r}: expected comma-separated token counts, e.g. 256,2048") from None
    if not chosen_depths or min(chosen_depths) < 1:
        raise UsageError(f"--depths {depths!r}: every depth must be at least 1 token")
    if why and depths is None and output_len is None:
        err_console().print(f"note: {why}", highlight=False)
    config = ProfileConfig(kinds=chosen, depths=chosen_depths, prompts_per_cell=prompts,
                           output_len=output_len or default_out, warmup=warmup, seed=seed, sequential=sequential)
    out_path = writable_file(out, "--out") or _default_out(f"profile-{Path(recipe).stem}")
    with progress_reporter() as on_progress:
        doc = run_profile(recipe, config, overrides=list(set_), out_path=out_path, on_progress=on_progress)
    err_console().print(f"saved {out_path}", highlight=False)
    if as_json:
        print_json(doc)
    else:
        render_profile(doc)


@bench_app.command("steps")
def steps(
    run: str | None = typer.Argument(None, help="Run id or recipe name of a started server (default: the latest live run)."),
    url: str | None = typer.Option(None, "--url", help="Profile this server instead of a run (it must run on this machine)."),
    api_key: str | None = typer.Option(None, "--api-key", help="Bearer key to send (default: a run's key, from its recipe's server.api_key_env; else $SPARKIT_API_KEY for a --url server sparkit did not start)."),
    num_steps: int = typer.Option(32, "--steps", min=2, help="Forward passes to trace (the prefill is one)."),
    input_len: int = typer.Option(64, "--input-len", min=1, help="Prompt tokens of the traced request."),
    stage: str | None = typer.Option(None, "--stage", help="Which steps to summarise: DECODE (plain decoding) or VERIFY (speculative); default: DECODE, or VERIFY for a server that decodes speculatively."),
    trace: Path | None = typer.Option(None, "--trace", help="Summarise this trace file (a .trace.json[.gz] from /start_profile) instead of profiling a server."),
    keep_trace: Path | None = typer.Option(None, "--keep-trace", help="Also copy the raw trace into this directory."),
    out: Path | None = typer.Option(None, "--out", help="Write the breakdown JSON here."),
    as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout (progress and messages on stderr)."),
) -> None:
    """Where a decode step's time goes, from the server's own profiler (SGLang's /start_profile):
    KDA and MLA attention, MoE, dense MLP, lm_head, logits processing, sampling, gaps between kernels."""
    from sparkit.bench.steps import StepsConfig, profile_steps
    from sparkit.bench.trace import summarise_file, table
    from sparkit.errors import UsageError
    from sparkit.paths import write_atomic
    from sparkit.runs import resolve_server

    stage = stage.upper() if stage is not None else None
    if stage is not None and stage not in ("DECODE", "VERIFY", "EXTEND", "DRAFT"):
        raise UsageError(f"--stage {stage!r}: one of DECODE, VERIFY, EXTEND, DRAFT")
    out_path = writable_file(out, "--out")
    keep = writable_dir(keep_trace, "--keep-trace")
    if trace is not None:
        if run or url:
            raise UsageError("--trace summarises a file: it takes no RUN or --url")
        breakdown, done = summarise_file(trace, stage=stage), {"trace": str(trace)}
    else:
        target = resolve_server(run, url, api_key)
        from sparkit.cli.common import require_server

        require_server(target.url, target.api_key)
        config = StepsConfig(num_steps=num_steps, input_len=input_len, stage=stage, keep_trace=keep)
        breakdown, done = run_async(profile_steps(target.url, config, api_key=target.api_key,
                                                  on_progress=lambda m: err_console().print(m, highlight=False)))
    doc = {"breakdown": breakdown.to_dict(), "profiled": done}
    if out_path is not None:
        import json as _json

        write_atomic(out_path, _json.dumps(doc, indent=1))
        err_console().print(f"saved {out_path}", highlight=False)
    if as_json:
        print_json(doc)
        return
    for line in table(breakdown):
        console().print(line, highlight=False, markup=False, soft_wrap=True)


def render_profile(doc: dict[str, Any]) -> None:
    from rich.table import Table

    cfg = doc["config"]
    table = Table(title=f"acceptance profile: {doc['recipe']} ({doc['speculative']['method']}) vs no speculation, "
                  f"{cfg['prompts_per_cell']} prompts per cell, {cfg['output_len']} tokens out, greedy"
                  + (", interleaved" if not cfg["sequential"] else ", one server after the other"),
                  title_justify="left")
    for column in ("kind", "depth", "accept", "MTP tok/s", "plain tok/s", "speed-up", "noise", "model"):
        table.add_column(column, justify="left" if column == "kind" else "right", no_wrap=column == "kind")
    for c in doc["cells"]:
        speed = "-" if c["speedup"] is None else f"{c['speedup'] - 1:+.0%}"
        model = "-" if c["model_speedup"] is None else f"{c['model_speedup'] - 1:+.0%}"
        depth = f"{c['depth']}" + ("*" if c["wrapped"] else "")
        table.add_row(c["kind"], depth, _fmt(c["accept_length"]), _fmt(c["tok_s_on"], 1), _fmt(c["tok_s_off"], 1),
                      speed, "-" if c["noise"] is None else f"±{c['noise']:.0%}", model)
    console().print(table)
    colours = {"pays": "green", "loses": "red"}
    for v in doc["verdicts"]:
        colour = colours.get(v["verdict"])
        console().print(f"[{colour}]{v['sentence']}[/]" if colour else v["sentence"], highlight=False)
    notes = ["speed-up = median over prompts of TPOT(plain) / TPOT(MTP), paired; noise = 2 standard errors; "
             "model = the bandwidth roofline's speed-up at the cell's accept length"]
    if any(c["wrapped"] for c in doc["cells"]):
        notes.append("* the kind's shipped text is shorter than the depth: it repeats, which flatters the draft")
    for c in doc["cells"]:
        for error in c["errors"]:
            notes.append(f"{c['kind']} at {c['depth']}: {error}")
    for note in notes:
        console().print(f"note: {note}", highlight=False, soft_wrap=True)


def render_sweep(doc: dict[str, Any]) -> None:
    from rich.table import Table

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
        label = ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in point["values"].items())
        f = point.get("figures") or {}
        if point.get("status") != "done":
            table.add_row(label, "-", "-", "-", "-", point.get("status", "?") + (f": {point['error'][:60]}" if point.get("error") else ""))
            continue
        position = order.index(index) + 1 if index in order else "-"
        mark = f"[bold green]{position} (best)[/]" if index == best else str(position)
        table.add_row(
            label, _fmt(f.get("accept_length_mean")), _fmt(f.get("tpot_mean_ms"), 3),
            _fmt(f.get("step_time_estimate_ms"), 3), _fmt(f.get("output_throughput_tok_s"), 1), mark,
        )
    console().print(table)
    if ranking.get("verdict"):
        console().print(ranking["verdict"])
    rate = ("output tokens / the time that point's own requests took (interleaved run)" if doc.get("interleaved")
            else "output tokens / wall time")
    console().print(f"step time = mean TPOT x mean accept length (an estimate, not a measurement); tok/s = {rate}.")


def tune(
    recipe: str = typer.Argument(..., help="Recipe file or shipped name to sweep."),
    param: list[str] = typer.Option(..., "--param", help="KEY=V1,V2,... e.g. speculative.num_steps=1,2,3,4 (repeatable: a grid)."),
    set_: list[str] = typer.Option([], "--set", help="Extra KEY=VALUE override applied to every point."),
    out: Path | None = typer.Option(None, "--out", help="Sweep JSON (rewritten after each point; rerun to resume)."),
    write_recipe_dir: Path | None = typer.Option(None, "--recipe-dir", help="Where to write the best recipe (default: beside the recipe; the current directory for a shipped one)."),
    no_recipe: bool = typer.Option(False, "--no-recipe", help="Write no recipe file, only the sweep's results."),
    input_len: int | None = typer.Option(None, "--input-len", min=1, help="Prompt tokens per request (default: 3/8 of the context the model was made for, at most 1024; tiny-ling 48)."),
    output_len: int | None = typer.Option(None, "--output-len", min=1, help="Output tokens per request (default: half that context, at most 256; tiny-ling 64)."),
    num_prompts: int = typer.Option(8, "--num-prompts", help="Measured requests per point."),
    dataset: str | None = typer.Option(None, "--dataset", help="profile:mixed (the default: code, prose, math and chat text in turn) | profile:KIND (e.g. profile:math) | random | gsm8k | FILE."),
    warmup: int = typer.Option(1, "--warmup", help="Unmeasured requests before each point."),
    seed: int = typer.Option(0, "--seed", help="Seed for the random prompts."),
    repeats: int = typer.Option(1, "--repeats", help="Repeat the interleaved round to measure run-to-run noise."),
    sequential: bool = typer.Option(False, "--sequential", help="One server at a time instead of all up and interleaved (less memory, more drift)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout (progress and messages on stderr)."),
) -> None:
    """Sweep recipe values (one server each), rank by TPOT and step-time estimate, write the best recipe to a new file."""
    from sparkit.bench.runner import BenchConfig
    from sparkit.bench.tune import parse_params, run_tune, tuned_recipe_dir
    from sparkit.bench.workload import TUNE_DATASET, model_context, tune_shape
    from sparkit.errors import UsageError
    from sparkit.recipes.load import load_recipe

    parse_params(param)  # usage errors before anything starts
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
    # Up front, before any server starts: the workload, and every file the sweep will write.
    why = f" ({context.why})" if context is not None and (input_len is None or output_len is None) else ""
    err_console().print(f"workload: {chosen[0]}, {chosen[1]} tokens in / {chosen[2]} out, {num_prompts} prompts per "
                        f"point{why}", highlight=False, soft_wrap=True)
    err_console().print(f"writes: the sweep to {out_path} (rewritten as points finish; rerun to resume)",
                        highlight=False, soft_wrap=True)
    if no_recipe or loaded.path is None:
        err_console().print("writes no recipe file" + ("" if no_recipe else f": {loaded.name} is not a file"),
                            highlight=False)
    else:
        where, reason = tuned_recipe_dir(Path(loaded.path), write_recipe_dir)
        err_console().print(f"writes: the best point's recipe as a new file {Path(where).resolve()}/"
                            f"{Path(loaded.path).stem}-tuned-<point>.yaml ({reason}; --recipe-dir DIR puts it "
                            "elsewhere, --no-recipe writes none)", highlight=False, soft_wrap=True)

    def said(point: Any, index: int, total: int) -> None:
        f = point.figures or {}
        err_console().print(
            f"[{index + 1}/{total}] {point.label}: {point.status}"
            + (f", TPOT {_fmt(f.get('tpot_mean_ms'), 3)} ms, accept {_fmt(f.get('accept_length_mean'))}" if point.status == "done" else f" {point.error or ''}")
            + (f" [yellow](startup checks failed: {', '.join(point.startup_failed)}; not recommended)[/]"
               if point.startup_failed else "")
        )

    with progress_reporter() as on_progress:
        doc = run_tune(recipe, param, config, out_path=out_path, base_overrides=set_,
                       write_recipe_dir=write_recipe_dir, write_recipe=not no_recipe, on_point=said,
                       on_progress=on_progress, interleave=not sequential)
    err_console().print(f"sweep saved to {out_path}", highlight=False, soft_wrap=True)
    if doc.get("best_recipe"):  # on stderr in both modes: where a new file appeared is never a surprise
        err_console().print(f"best recipe written to {doc['best_recipe']} ({doc.get('best_recipe_where')})",
                            highlight=False, soft_wrap=True)
    elif doc.get("ranking") and not no_recipe:
        err_console().print("no recipe written: no point finished", highlight=False)
    if as_json:
        print_json(doc)
    else:
        render_sweep(doc)


def verify(
    recipe: str = typer.Argument(..., help="The candidate recipe."),
    against: str = typer.Option(..., "--against", help="The baseline (reference) recipe."),
    set_: list[str] = typer.Option([], "--set", help="Override for the candidate recipe."),
    against_set: list[str] = typer.Option([], "--against-set", help="Override for the baseline recipe."),
    rounding_changing: list[str] = typer.Option([], "--rounding-changing", help="Declare a rounding-changing optimisation not visible in the recipes (repeatable)."),
    num_prompts: int | None = typer.Option(None, "--num-prompts", help="Use the first N of the fixed prompts (default all 8)."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", "--max-tokens", help="Greedy tokens per prompt."),
    greedy_only: bool = typer.Option(False, "--greedy-only", help="Send no sampled request: skip the state-pollution re-run (SGLang's NEXTN without flashinfer dies on one)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout (progress and messages on stderr)."),
) -> None:
    """Correctness gate: byte-exact greedy outputs, accept length within 0.05, no state pollution
    (for a rounding-changing optimisation such as an FP8 lm_head: token agreement and accept length)."""
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


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
    app.command("tune")(tune)
    app.command("verify")(verify)
