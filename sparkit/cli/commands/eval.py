"""`sparkit eval gsm8k` and `sparkit eval compare`: parse, call sparkit.evals, render."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from sparkit import interrupts
from sparkit.cli import options
from sparkit.cli.command_tree import SparkitTyper
from sparkit.errors import EXIT_INTERRUPTED, UsageError

eval_app = SparkitTyper(no_args_is_help=True)


def _default_out() -> Path:
    from sparkit.paths import data_dir

    return data_dir() / "evals" / f"gsm8k-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"


def _latest_results() -> Path:
    from sparkit.paths import data_dir

    files = sorted((data_dir() / "evals").glob("gsm8k-*.jsonl"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise UsageError("--resume found no earlier results to continue", hint="pass --out FILE of the run to resume")
    return files[-1]


def _load_dataset(data: Path | None, need_train: bool, from_hub: bool = False) -> Any:
    """The dataset, with a progress bar on stderr while a first --from-hub run downloads it."""
    import sys

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sparkit.cli.common import ProgressLines, err_console, is_terminal
    from sparkit.evals.gsm8k.data import load_dataset

    bar: Progress | None = None
    lines = None if is_terminal(sys.stderr) else ProgressLines()

    def on_download(p: Any) -> None:
        nonlocal bar
        if lines is not None:
            lines.update(f"GSM8K from the hub {p.split}", p.done, p.total)
            return
        if bar is None:
            bar = Progress(TextColumn("[bold]GSM8K from the hub[/] {task.fields[split]}"), BarColumn(),
                           MofNCompleteColumn(), TimeElapsedColumn(), console=err_console())
            interrupts.held(bar.start)  # a refresh thread starts: held (sparkit.interrupts)
            bar.add_task("download", total=p.total, split=p.split)
        bar.update(bar.task_ids[0], completed=p.done, split=p.split)

    try:
        return load_dataset(data, need_train=need_train, from_hub=from_hub, on_download=on_download)
    finally:
        if bar is not None:
            bar.stop()


@eval_app.command("gsm8k")
def gsm8k(
    run: options.ServerRun = None,
    url: options.Url = None,
    api_key: options.ApiKey = None,
    data: Path | None = typer.Option(None, "--data", help="GSM8K test.jsonl (train.jsonl beside it); default: the copy shipped with sparkit (offline)."),
    from_hub: bool = typer.Option(False, "--from-hub", help="Download openai/gsm8k from the Hugging Face hub once (cached) instead of the shipped copy."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Only the first N test questions (default: all 1319)."),
    shots: int = typer.Option(5, "--shots", min=0, help="Few-shot chain-of-thought exemplars, drawn from the train split."),
    fmt: str = typer.Option("chat", "--format", metavar="chat|completion", help="chat (chat template, /v1/chat/completions) or completion (base models, /generate)."),
    temperature: float | None = typer.Option(None, "--temperature", min=0.0, help="Sampling temperature (default 0.6, the published protocol)."),
    top_p: float | None = typer.Option(None, "--top-p", min=0.0, max=1.0, help="Nucleus sampling top_p (default 0.95)."),
    top_k: int | None = typer.Option(None, "--top-k", help="Top-k sampling; -1 means off (default 29)."),
    greedy: bool = typer.Option(False, "--greedy", help="Greedy decoding (temperature 0), e.g. for reproducible A/B runs."),
    max_tokens: int = typer.Option(4096, "--max-tokens", min=1, help="Max output tokens per question."),
    concurrency: int = typer.Option(1, "--concurrency", min=1, help="Requests kept in flight."),
    seed: int = typer.Option(0, "--seed", help="Base of the per-question sampling seeds."),
    out: Path | None = typer.Option(None, "--out", metavar="FILE", help="Results JSONL (default: under sparkit's data dir)."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted results file (same settings required)."),
    as_json: options.Json = False,
) -> None:
    """Measure GSM8K accuracy (5-shot CoT, train-split exemplars) on a live server."""
    from sparkit.cli.common import err_console, print_json, run_async, writable_file
    from sparkit.evals.gsm8k.eval_settings import EvalSettings
    from sparkit.evals.gsm8k.evaluate import EvalRequest, run_eval
    from sparkit.evals.gsm8k.prompts import choose_exemplars
    from sparkit.evals.gsm8k.summary import summary_path_for
    from sparkit.runs import resolve_server

    if fmt not in ("chat", "completion"):
        raise UsageError(f"--format must be chat or completion, got {fmt!r}")
    temperature, top_p, top_k = _sampling_flags(greedy, temperature, top_p, top_k)

    out = writable_file(out, "--out")
    if out is None:
        out = _latest_results() if resume else _default_out()
    # No up-front probe of the server: the local inputs (the data, the results file and its
    # header, --resume's settings) are checked and kept first, so that a run against a server that
    # is not up yet can be resumed; the first request names the server that did not answer (exit 7).
    target = resolve_server(run, url, api_key)
    dataset = _load_dataset(data, need_train=shots > 0, from_hub=from_hub)
    questions = dataset.test[:limit] if limit else dataset.test
    exemplars = choose_exemplars(dataset.train, shots, exclude=questions)
    settings = EvalSettings(
        data_sha256=dataset.sha256, shots=shots, format=fmt, temperature=temperature, top_p=top_p, top_k=top_k,
        max_tokens=max_tokens, seed=seed, exemplar_ids=[e.id for e in exemplars],
    )
    request = EvalRequest(
        url=target.url, settings=settings, questions=questions, exemplars=exemplars, out=out,
        concurrency=concurrency, resume=resume, api_key=target.api_key,
        recipe=target.run.recipe_name if target.run is not None else None,
        run_id=target.run.id if target.run else None, data_path=str(dataset.test_path),
    )

    err = err_console()
    err.print(f"GSM8K ({dataset.source}): {len(questions)} questions, {shots}-shot {fmt}, "
              f"{'greedy' if greedy else f'T={temperature} top_p={top_p} top_k={top_k}'}, "
              f"concurrency {concurrency} -> {out}", highlight=False, soft_wrap=True)
    display, on_progress = _progress_display(err, len(questions))

    from sparkit.cli.common import resume_command, say, signals_as_interrupt

    signals_as_interrupt()  # SIGTERM and SIGHUP too: the answers so far are kept and the hint is said
    try:
        with display:
            summary = run_async(run_eval(request, on_progress))
    except KeyboardInterrupt:
        say(err, f"interrupted; finished questions are saved in {out}\n  resume with: "
            f"{resume_command('--out', str(out), '--resume')}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None

    if as_json:
        print_json(summary)
    else:
        render_summary(summary)
        err.print(f"results: {out}\nsummary: {summary_path_for(out)}", highlight=False)


def _sampling_flags(greedy: bool, temperature: float | None, top_p: float | None,
                    top_k: int | None) -> tuple[float, float, int]:
    """--greedy, or the published protocol's sampling where a flag is not given."""
    if greedy and any(v is not None for v in (temperature, top_p, top_k)):
        raise UsageError("--greedy cannot be combined with --temperature/--top-p/--top-k")
    if greedy:
        return 0.0, 1.0, -1
    return (0.6 if temperature is None else temperature, 0.95 if top_p is None else top_p,
            29 if top_k is None else top_k)


def _progress_display(err: Any, total: int) -> tuple[Any, Any]:
    """What shows a GSM8K run's progress (a context to hold it in) and its callback: a bar on a
    terminal; in a log or CI a line per finished question, not a bar drawn at the end."""
    import contextlib
    import sys

    from sparkit.cli.common import ProgressLines, is_terminal
    from sparkit.evals.gsm8k.evaluate import Progress

    if is_terminal(sys.stderr):
        return _progress_bar(err, total)
    lines = ProgressLines()

    def on_progress(p: Progress) -> None:
        acc = f"acc {100 * p.correct_flexible / p.done:.1f}%" if p.done else ""
        lines.update("gsm8k", p.done, p.total, acc)

    return contextlib.nullcontext(), on_progress


def _progress_bar(err: Any, total: int) -> tuple[Any, Any]:
    """The terminal's progress bar of a GSM8K run and its callback."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from sparkit.evals.gsm8k.evaluate import Progress as EvalProgress

    bar = Progress(
        TextColumn("[bold]gsm8k"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("acc {task.fields[acc]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=err,
        transient=False,
    )
    task = bar.add_task("gsm8k", total=total, acc="-")

    def on_progress(p: EvalProgress) -> None:
        acc = f"{100 * p.correct_flexible / p.done:.1f}%" if p.done else "-"
        bar.update(task, completed=p.done, acc=acc)

    return bar, on_progress


def _pct(p: dict[str, Any]) -> str:
    return f"{100 * p['value']:.2f}% [{100 * p['ci95_low']:.2f}, {100 * p['ci95_high']:.2f}]"


def render_summary(summary: dict[str, Any]) -> None:
    from rich.table import Table

    from sparkit.cli.common import console

    table = Table(title="GSM8K", show_header=False, title_justify="left")
    table.add_column("", style="bold")
    table.add_column("")
    n, total = summary["n"], summary["total"]
    table.add_row("questions", f"{n}" + ("" if summary["complete"] else f" of {total} (incomplete: --resume to finish)"))
    table.add_row("accuracy, flexible (95% Wilson)", _pct(summary["accuracy"]["flexible"]))
    table.add_row("accuracy, strict (95% Wilson)", _pct(summary["accuracy"]["strict"]))
    inv = summary["invalid_rate"]
    table.add_row("invalid (no number)", f"flexible {100 * inv['flexible']:.1f}%, strict {100 * inv['strict']:.1f}%")
    table.add_row("truncated at --max-tokens", str(summary["truncated"]))
    if summary["mean_latency_s"] is not None:
        table.add_row("mean latency", f"{summary['mean_latency_s']:.2f} s")
    if summary["output_throughput_tok_s"] is not None:
        table.add_row(f"output throughput @ concurrency {summary['concurrency']}", f"{summary['output_throughput_tok_s']:.1f} tok/s")
    accept = summary["mean_accept_length"]
    table.add_row("mean accept length", f"{accept:.2f}" if accept is not None else "n/a (no speculation reported)")
    table.add_row("recipe", str(summary.get("recipe") or "-"))
    table.add_row("model", str(summary.get("model") or "-"))
    for key, value in summary["server_args"].items():
        table.add_row(f"  {key}", str(value))
    console().print(table)


@eval_app.command("compare")
def compare(
    a: Path = typer.Argument(..., help="Results of the reference run (A)."),
    b: Path = typer.Argument(..., help="Results of the run under test (B)."),
    metric: str = typer.Option("flexible", "--metric", metavar="flexible|strict", help="Extraction the verdict uses: flexible or strict."),
    alpha: float = typer.Option(0.05, "--alpha", min=0.0, max=1.0, help="Significance level of the verdict."),
    as_json: options.Json = False,
) -> None:
    """Paired McNemar comparison of two GSM8K runs on the questions both answered."""
    from sparkit.cli.common import print_json
    from sparkit.evals.compare import compare_files

    result = compare_files(a, b, metric=metric, alpha=alpha)
    if as_json:
        print_json(result)
        return
    render_compare(result)


def render_compare(result: dict[str, Any]) -> None:
    from rich.table import Table

    from sparkit.cli.common import console, err_console

    table = Table(title=f"GSM8K paired comparison ({result['n_paired']} questions)", title_justify="left")
    for col in ("extraction", "A", "B", "b (A only)", "c (B only)", "McNemar p"):
        table.add_column(col)
    for name, m in result["metrics"].items():
        table.add_row(name, _pct(m["a"]), _pct(m["b"]), str(m["b_discordant"]), str(m["c_discordant"]), f"{m['mcnemar_p']:.3g}")
    console().print(table)
    console().print(f"verdict ({result['metric']}): {result['verdict']}", highlight=False)
    if result["a_only_answered"] or result["b_only_answered"]:
        err_console().print(
            f"note: {result['a_only_answered']} questions only in A and {result['b_only_answered']} only in B were left out",
            highlight=False,
        )
    if not result["same_settings"]:
        err_console().print("note: the two runs used different settings (sampling, shots or format)", highlight=False)
