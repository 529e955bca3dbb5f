"""`sparkit bench` (a live server's batch-1 decode figures), `bench compare`, `bench profile`, `bench
steps`: parse, call sparkit.bench, render. Progress goes to stderr; --json prints one document on
stdout. `progress_reporter` is also what tune, verify and ladder show."""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import typer

from sparkit.cli import options
from sparkit.cli.command_tree import SparkitGroup, SparkitTyper
from sparkit.cli.common import console, err_console, print_json, run_async, writable_dir, writable_file


class _BenchGroup(SparkitGroup):
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


bench_app = SparkitTyper(cls=_BenchGroup, invoke_without_command=True, no_args_is_help=False)


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
    if doc.get("side_by_side"):
        console().print(f"[bold red]warning:[/] {doc['side_by_side']['warning']}", highlight=False, soft_wrap=True)
    from sparkit.bench.limit import limit_sentence

    limit = doc.get("limit")
    if limit:
        console().print(limit_sentence(limit), highlight=False, markup=False, soft_wrap=True)
    elif doc.get("server", {}).get("run_id") is None:
        console().print("no bandwidth limit: the server's recipe is unknown (--recipe names it)", highlight=False)


@bench_app.callback()
def bench(
    ctx: typer.Context,
    run: options.ServerRun = None,
    url: options.Url = None,
    api_key: options.ApiKey = None,
    recipe_ref: str | None = typer.Option(None, "--recipe", metavar="RECIPE", help="The recipe the --url server runs (for its bandwidth limit; a run knows its own; --set overrides its keys)."),
    set_: options.Overrides = (),
    input_len: int = typer.Option(8192, "--input-len", help="Prompt tokens per request (random dataset)."),
    output_len: int = typer.Option(1024, "--output-len", help="Output tokens per request (ignore_eos)."),
    num_prompts: int = typer.Option(10, "--num-prompts", help="Measured requests per repeat."),
    concurrency: int = typer.Option(1, "--concurrency", help="Requests in flight at once."),
    dataset: str = typer.Option("random", "--dataset", metavar="DATASET", help="random | gsm8k | profile:KIND (code, prose, math, chat, repetitive: sparkit's texts cut to --input-len tokens) | path to a .jsonl/.txt prompt file."),
    warmup: int = typer.Option(1, "--warmup", help="Unmeasured requests before each repeat."),
    seed: options.PromptSeed = 0,
    out: Path | None = typer.Option(None, "--out", metavar="FILE", help="Result JSON (written as it goes; rerun to resume). Default: under the data dir."),
    repeats: int = typer.Option(1, "--repeats", help="Repeat the whole benchmark to measure run-to-run noise."),
    as_json: options.Json = False,
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

    beside = _servers_beside(target)  # said on stderr: figures taken beside other servers
    signals_as_interrupt()  # SIGTERM and SIGHUP too: what was measured is kept and the hint is said
    try:
        with progress_reporter() as on_progress:
            doc = run_async(
                run_bench(target.url, config, api_key=target.api_key, out_path=out_path, recipe=recipe, run_id=run_id,
                          on_progress=on_progress, beside=beside)
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


def _servers_beside(target: Any) -> list[dict[str, Any]]:
    """The other live servers sparkit started on this machine (not the one measured), said on
    stderr when there are any: batch-1 figures taken beside them are not sound to compare."""
    from sparkit.bench.runner import side_by_side
    from sparkit.cli.common import say
    from sparkit.runs import live_runs

    own = target.url.rstrip("/")
    beside = [{"run": r.id, "url": r.url, "recipe": r.recipe_name} for r in live_runs()
              if r.url.rstrip("/") != own and (target.run is None or r.id != target.run.id)]
    if beside:
        say(err_console(), f"warning: {side_by_side(beside)['warning']}: "
            + ", ".join(b["run"] or b["url"] for b in beside), highlight=False, soft_wrap=True)
    return beside


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
    as_json: options.Json = False,
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
        loud = "side by side" in note
        console().print(f"[bold red]warning:[/] {note}" if loud else f"note: {note}", highlight=False)


@bench_app.command("profile")
def profile(
    recipe: str = typer.Argument(..., help="Recipe with speculative decoding (file or shipped name)."),
    set_: options.Overrides = (),
    kinds: str | None = typer.Option(None, "--kinds", metavar="KIND,...", help="Comma-separated kinds of text (default all: code,prose,math,chat,repetitive)."),
    depths: str | None = typer.Option(None, "--depths", metavar="TOKENS,...", help="Comma-separated prompt lengths in tokens (default 256,2048; tiny-ling 32,96)."),
    prompts: int = typer.Option(4, "--prompts", min=1, help="Prompts per cell (kind x depth)."),
    output_len: int | None = typer.Option(None, "--output-len", min=2, help="Output tokens per request (default 128; tiny-ling 32)."),
    warmup: int = typer.Option(1, "--warmup", min=0, help="Unmeasured requests to each server first."),
    seed: int = typer.Option(0, "--seed", help="Which passages the prompts start at."),
    sequential: bool = typer.Option(False, "--sequential", help="One server after the other instead of both up, interleaved (for a model that fits once)."),
    out: Path | None = typer.Option(None, "--out", metavar="FILE", help="Profile JSON (default: under the data dir)."),
    as_json: options.Json = False,
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
    if not sequential:
        from sparkit.bench.runner import SIDE_BY_SIDE_WARNING

        err_console().print(f"[bold red]warning:[/] both servers are up and interleaved, so each speed is "
                            f"{SIDE_BY_SIDE_WARNING.format(n=1)}; --sequential measures one at a time",
                            highlight=False, soft_wrap=True)
    with progress_reporter() as on_progress:
        doc = run_profile(recipe, config, overrides=list(set_), out_path=out_path, on_progress=on_progress)
    err_console().print(f"saved {out_path}", highlight=False)
    if as_json:
        print_json(doc)
    else:
        render_profile(doc)


@bench_app.command("steps")
def steps(
    run: options.ServerRun = None,
    url: options.Url = None,
    api_key: options.ApiKey = None,
    num_steps: int = typer.Option(32, "--steps", min=2, help="Forward passes to trace (the prefill is one)."),
    input_len: int = typer.Option(64, "--input-len", min=1, help="Prompt tokens of the traced request."),
    stage: str | None = typer.Option(None, "--stage", help="Which steps to summarise: DECODE (plain decoding) or VERIFY (speculative); default: DECODE, or VERIFY for a server that decodes speculatively."),
    trace: Path | None = typer.Option(None, "--trace", help="Summarise this trace file (a .trace.json[.gz] from /start_profile) instead of profiling a server."),
    keep_trace: Path | None = typer.Option(None, "--keep-trace", help="Also copy the raw trace into this directory."),
    out: Path | None = typer.Option(None, "--out", metavar="FILE", help="Write the breakdown JSON here."),
    as_json: options.Json = False,
) -> None:
    """Where a decode step's time goes, from the server's own profiler (SGLang's /start_profile):
    KDA and MLA attention, MoE, dense MLP, lm_head, logits processing, sampling, gaps between kernels.
    A --url server must run on this machine (its trace is read from this disk)."""
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
