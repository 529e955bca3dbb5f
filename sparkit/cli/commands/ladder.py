"""`sparkit ladder`: run a list of recipes one after another, print what each step bought."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from sparkit.cli import options
from sparkit.cli.common import console, err_console, print_json, writable_file


def _is_ladder(ref: str) -> bool:
    """A shipped ladder name, or a YAML file whose top level has `steps:`."""
    from sparkit.bench.ladder import shipped_ladders

    if ref in dict(shipped_ladders()):
        return True
    path = Path(ref).expanduser()
    if not (path.is_file() and path.suffix in (".yaml", ".yml")):
        return False
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and "steps" in data


def ladder_cmd(
    ladder_or_recipes: list[str] = typer.Argument(None, help="A ladder (shipped name or file; default `spark`), or recipes, one step each."),
    set_: options.Overrides = (),
    input_len: int | None = typer.Option(None, "--input-len", min=1, help="Prompt tokens per request (default: the ladder's)."),
    output_len: int | None = typer.Option(None, "--output-len", min=2, help="Output tokens per request (default: the ladder's)."),
    num_prompts: int | None = typer.Option(None, "--num-prompts", min=1, help="Measured requests per step (default: the ladder's)."),
    warmup: int | None = typer.Option(None, "--warmup", min=0, help="Unmeasured requests before each step's benchmark."),
    dataset: str | None = typer.Option(None, "--dataset", metavar="DATASET", help="random | profile:KIND | FILE (default: the ladder's)."),
    gsm8k: int | None = typer.Option(None, "--gsm8k", min=0, help="Answer the first N GSM8K test questions per step (greedy), McNemar against the first step."),
    gsm8k_data: Path | None = typer.Option(None, "--gsm8k-data", help="GSM8K test.jsonl (train.jsonl beside it); default: openai/gsm8k from the hub, cached."),
    out: Path | None = typer.Option(None, "--out", metavar="FILE", help="Ladder JSON, rewritten after every step (default: under the data dir)."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted ladder (--out FILE, else this ladder's newest file): finished steps are kept."),
    timeout: float = typer.Option(600, "--timeout", metavar="SECONDS", min=1, help="Seconds each step's server may take to start."),
    list_: bool = typer.Option(False, "--list", help="List the shipped ladders and exit."),
    show: Path | None = typer.Option(None, "--show", help="Print the table of a ladder document (finished or not) and exit; runs nothing."),
    as_json: options.Json = False,
) -> None:
    from sparkit.bench import ladder as core
    from sparkit.cli.common import say, signals_as_interrupt
    from sparkit.errors import CheckFailed, UsageError
    from sparkit.runs import mark_stale

    if show is not None:
        doc = core.read_document(show.expanduser())
        if as_json:
            print_json(doc)
        else:
            render_ladder(doc)
        return
    if list_:
        _list_ladders(as_json)
        return
    ladder = _chosen_ladder(list(ladder_or_recipes or []))
    settings = core.settings_for(ladder, input_len=input_len, output_len=output_len, num_prompts=num_prompts,
                                 warmup=warmup, dataset=dataset, gsm8k_questions=gsm8k,
                                 gsm8k_data=str(gsm8k_data.expanduser()) if gsm8k_data else None, overrides=list(set_))
    if settings.gsm8k_data and not Path(settings.gsm8k_data).is_file():
        raise UsageError(f"--gsm8k-data {settings.gsm8k_data}: no such file", hint="the GSM8K test.jsonl, train.jsonl beside it")
    out_path = writable_file(out, "--out")
    if out_path is None:
        out_path = core.latest_document(ladder.name) if resume else core.default_out(ladder.name)
        if out_path is None:
            raise UsageError(f"--resume found no earlier {ladder.name} ladder to continue",
                             hint="pass --out FILE of the ladder to resume")
    # SIGTERM and SIGHUP end it as Ctrl-C does: the step under way stops its server, the finished
    # ones are kept. The servers of a ladder that was killed are recorded as what became of them.
    signals_as_interrupt()
    mark_stale()
    err = err_console()
    err.print(f"ladder {ladder.name}: {len(ladder.spec.steps)} steps, {settings.bench.dataset} "
              f"{settings.bench.input_len} in / {settings.bench.output_len} out x {settings.bench.num_prompts}"
              + (f", GSM8K {settings.gsm8k_questions} questions" if settings.gsm8k_questions else "")
              + f" -> {out_path}", highlight=False, soft_wrap=True)
    on_step = _step_reporter(err)

    from sparkit.cli.commands.bench import progress_reporter

    try:
        with progress_reporter() as on_progress:
            doc = core.run_ladder(ladder, settings, out_path=out_path, resume=resume, on_step=on_step,
                                  on_progress=on_progress, launch_timeout=timeout)
    except KeyboardInterrupt:
        say(err, f"interrupted; the finished steps are saved in {out_path}\n  resume with the same arguments plus "
                 f"--out {out_path} --resume", highlight=False, soft_wrap=True)
        raise
    err.print(f"saved {out_path}", highlight=False, soft_wrap=True)
    if as_json:
        print_json(doc)
    else:
        render_ladder(doc)
    unfinished = [s for s in doc["steps"] if s["status"] != core.DONE]
    if unfinished:
        raise CheckFailed("ladder finished with " + "; ".join(f"step {s['index'] + 1} ({s['label']}) {s['status']}"
                                                             for s in unfinished),
                          hint="each step's startup checks and error are in the table above (and --json)")


def _list_ladders(as_json: bool) -> None:
    from sparkit.bench import ladder as core

    shipped = [{"name": n, "file": str(p), "description": core.load_ladder(n).spec.description,
                "steps": [s.recipe for s in core.load_ladder(n).spec.steps]} for n, p in core.shipped_ladders()]
    if as_json:
        print_json(shipped)
    else:
        for item in shipped:
            console().print(f"{item['name']:12} {item['description']}", highlight=False, markup=False, soft_wrap=True)


def _chosen_ladder(refs: list[str]) -> Any:
    """The ladder the arguments name: none (the default ladder), one ladder, or recipes (one step each)."""
    from sparkit.bench import ladder as core
    from sparkit.errors import UsageError

    if not refs:
        return core.load_ladder(core.DEFAULT_LADDER)
    if len(refs) == 1 and _is_ladder(refs[0]):
        return core.load_ladder(refs[0])
    if any(_is_ladder(r) for r in refs):
        raise UsageError("give one ladder, or recipes (one step each), not both",
                         hint="`sparkit ladder tiny` runs the shipped tiny ladder; `sparkit ladder A B C` runs recipes A, B, C")
    return core.ladder_of_recipes(refs)


def _step_reporter(err: Any) -> Callable[[Any, int, bool], None]:
    """A line on stderr as each step starts and ends, with what it measured."""

    def on_step(step: Any, total: int, starting: bool) -> None:
        head = f"[{step.index + 1}/{total}] {step.label} ({step.recipe}{' ' + ' '.join(step.overrides) if step.overrides else ''})"
        if starting:
            err.print(f"{head}: starting", highlight=False, markup=False, soft_wrap=True)
            return
        f = step.figures
        parts = [step.status]
        if step.failed_checks:
            parts.append(f"startup checks failed: {', '.join(step.failed_checks)}")
        if f.get("decode_tok_s"):
            parts.append(f"decode {f['decode_tok_s']:.1f} tok/s")
        if f.get("accept_length"):
            parts.append(f"accept {f['accept_length']:.2f}")
        if f.get("perplexity"):
            parts.append(f"perplexity {f['perplexity']:.3f}")
        if step.error:
            parts.append(step.error.splitlines()[0])
        err.print(f"{head}: " + "; ".join(parts), highlight=False, markup=False, soft_wrap=True)

    return on_step


def _num(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}"


def render_ladder(doc: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from sparkit.bench.ladder import fmt_ratio

    bench = doc["settings"]["bench"]
    published = any(step.get("published") for step in doc["steps"])
    table = Table(title=f"ladder {doc['ladder']}: {bench['dataset']} {bench['input_len']} in / {bench['output_len']} out, "
                        f"{bench['num_prompts']} prompts, batch 1, greedy", title_justify="left")
    columns = ["#", "step", "checks", "tok/s", "bought", "vs 1", "accept", "ppl", "GSM8K"]
    columns += ["published", "bought (pub.)"] if published else []
    for column in columns:
        table.add_column(column, justify="left" if column in ("step", "checks", "GSM8K") else "right",
                         no_wrap=column not in ("step", "checks", "GSM8K"), overflow="fold")
    colours = {"done": "green", "checks-failed": "yellow", "failed": "red", "interrupted": "red", "pending": "dim"}
    for step, row in zip(doc["steps"], doc["comparison"]):
        f = step["figures"]
        status = step["status"]
        checks = ("pass" if status == "done" else ", ".join(step["failed_checks"]) + " failed" if step["failed_checks"]
                  else status)
        bought = fmt_ratio(row["vs_previous"])
        if row["vs_previous"] is not None and row["vs_previous_noise"] is not None:
            bought += f" ±{row['vs_previous_noise']:.1%}"
        gsm = "-"
        if step.get("gsm8k"):
            gsm = f"{step['gsm8k']['accuracy']:.0%} of {step['gsm8k']['n']}"
            mc = row.get("gsm8k_vs_first")
            if mc and mc.get("mcnemar_p") is not None:
                gsm += f", p={mc['mcnemar_p']:.2g}"
        cells = [str(step["index"] + 1), escape(step["label"]), f"[{colours.get(status, '')}]{escape(checks)}[/]",
                 _num(f.get("decode_tok_s")), bought, fmt_ratio(row["vs_first"]), _num(f.get("accept_length"), 2),
                 _num(f.get("perplexity"), 3), gsm]
        if published:
            pub = step.get("published") or {}
            cells += [(f"{pub['tok_s']:.2f}" + (f" (accept {pub['accept']:.2f})" if pub.get("accept") else "")) if pub
                      else "-", fmt_ratio(row["published_vs_previous"])]
        table.add_row(*cells)
    console().print(table)
    console().print("tok/s = 1 / mean TPOT on the workload above; bought = against the previous measured step "
                    "(± twice the paired standard error of the per-prompt TPOT difference); vs 1 = against the first; "
                    "accept = the benchmark's mean accept length; ppl = the known-answer check's perplexity; "
                    "GSM8K = flexible-extraction accuracy, McNemar p against step 1"
                    + ("; published = the study's figure for the recipe as shipped (sparkit/roofline/published.py)"
                       if published else ""), highlight=False, soft_wrap=True)
    for step in doc["steps"]:
        if step.get("error"):
            console().print(f"step {step['index'] + 1}: {escape(step['error'])}", highlight=False, soft_wrap=True)
