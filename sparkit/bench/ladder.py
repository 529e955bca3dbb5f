"""`sparkit ladder`: a list of recipes run one after another on this machine, one table.

The DGX Spark study is a ladder: baseline -> + Humming MoE -> + FP8 lm_head -> + NEXTN MTP, each
step's figure next to the last. A ladder reproduces it in one command: each step starts its
recipe through the `up` pipeline (sparkit.runs.transient_server: preflight, build, launch, wait,
every startup check), measures decode speed on the ladder's one fixed workload (sparkit.bench:
TPOT, accept length), keeps the startup checks' known-answer perplexity and accept length, and
optionally answers a GSM8K subset (greedy) compared with the first step's by McNemar's test; then
the server stops and the next step starts. A step whose startup checks fail is marked and still
measured; a step that cannot start is marked failed; the ladder goes on either way.

The document (kind LADDER_KIND) is rewritten after every step, so an interrupted ladder keeps its
finished steps and `resume` continues with the rest (the same ladder and settings required).
Where a step's recipe has a published figure (sparkit.roofline.published: the study's), it sits
beside the measured one, and so does what each step bought over the previous, both measured
(with its noise: twice the paired standard error of the per-prompt TPOT difference) and published.

Ladders are YAML files (LadderSpec): the shipped ones in sparkit/bench/ladders/, or any file.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sparkit import interrupts
from sparkit.bench.runner import BenchConfig
from sparkit.errors import RecipeError, SparkitError, UsageError

LADDER_KIND = "sparkit-ladder"
LADDERS_DIR = Path(__file__).resolve().parent / "ladders"
DEFAULT_LADDER = "spark"
# Step states. FINISHED ones are kept by a resume; the others run (again).
PENDING, RUNNING, DONE, CHECKS_FAILED, FAILED, INTERRUPTED = (
    "pending", "running", "done", "checks-failed", "failed", "interrupted")
FINISHED = (DONE, CHECKS_FAILED)


# ------------------------------------------------------------------ the ladder file


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StepSpec(_Strict):
    """One step: a recipe (file or shipped name) and the overrides that make it this step."""

    recipe: str = Field(description="Recipe file or shipped name.")
    label: str | None = Field(None, description="What the step adds, in a few words (default: the recipe).")
    set: list[str] = Field(default_factory=list, description="KEY=VALUE overrides of this step, as --set.")


class BenchSpec(_Strict):
    """The one fixed workload every step is measured on (sparkit bench's settings)."""

    input_len: int = Field(8192, ge=1)
    output_len: int = Field(1024, ge=2)
    num_prompts: int = Field(3, ge=1)
    warmup: int = Field(1, ge=0)
    seed: int = 0
    dataset: str = "random"


class Gsm8kSpec(_Strict):
    """The optional GSM8K subset (greedy), compared with the first step's answers."""

    questions: int = Field(0, ge=0, description="Test questions per step (0: none unless --gsm8k N).")
    shots: int = Field(5, ge=0)
    max_tokens: int = Field(512, ge=1)
    format: Literal["chat", "completion"] = "chat"


class LadderSpec(_Strict):
    description: str = ""
    steps: list[StepSpec] = Field(min_length=1)
    bench: BenchSpec = Field(default_factory=BenchSpec)
    gsm8k: Gsm8kSpec = Field(default_factory=Gsm8kSpec)
    set: list[str] = Field(default_factory=list, description="KEY=VALUE overrides of every step.")


@dataclass
class Ladder:
    name: str
    source: str  # the file it came from, or "command line"
    spec: LadderSpec


def shipped_ladders() -> list[tuple[str, Path]]:
    return sorted((p.stem, p) for p in LADDERS_DIR.glob("*.yaml"))


def load_ladder(ref: str) -> Ladder:
    """A shipped ladder by name, or a ladder file. A bad file is a RecipeError (exit 3) naming
    file, line and key."""
    path = dict(shipped_ladders()).get(ref)
    if path is None:
        candidate = Path(ref).expanduser()
        if not candidate.is_file():
            names = ", ".join(n for n, _ in shipped_ladders())
            raise UsageError(f"no ladder {ref!r}: neither a shipped ladder ({names}) nor a file",
                             hint="`sparkit ladder --list` shows the shipped ladders; or give recipes as arguments")
        path = candidate
    from sparkit.recipes.load import display_path, parse_yaml

    file = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"cannot read the ladder file ({exc})", file=file) from None
    data, origins = parse_yaml(text, file)
    if not isinstance(data, dict):
        raise RecipeError("a ladder file is a mapping with `steps:` (a list of recipes)", file=file, line=1)
    from pydantic import ValidationError

    try:
        spec = LadderSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = tuple(str(p) for p in err["loc"])
        probe = loc
        while probe and probe not in origins:
            probe = probe[:-1]
        where = origins.get(probe)
        message = ("unknown key" if err["type"] == "extra_forbidden" else err["msg"][0].lower() + err["msg"][1:])
        raise RecipeError(message, file=file, line=where.line if where else None, column=where.column if where else None,
                          key=".".join(loc) or None,
                          hint="a ladder has description, steps (recipe, label, set), bench, gsm8k and set") from None
    return Ladder(path.stem if path.parent == LADDERS_DIR else str(path), file, spec)


def ladder_of_recipes(recipes: list[str]) -> Ladder:
    """A ladder of the recipes given on the command line. Its workload is BenchSpec's default,
    or for tiny-ling (trained on 128-token windows) the tiny ladder's: 32 tokens of prose in,
    96 out."""
    from sparkit.recipes.load import load_recipe

    spec = LadderSpec(steps=[StepSpec(recipe=r) for r in recipes])
    if load_recipe(recipes[0]).recipe.model.path.startswith("sparkit:tiny-ling"):
        spec.bench = BenchSpec(input_len=32, output_len=96, num_prompts=6, dataset="profile:prose")
        spec.gsm8k = Gsm8kSpec(shots=1, max_tokens=128)
    return Ladder("command line", "command line", spec)


# ------------------------------------------------------------------ settings and records


@dataclass
class LadderSettings:
    """What the ladder file sets, overridden from the command line; hashed into the document so
    that a resume continues the same measurement."""

    bench: BenchConfig
    gsm8k_questions: int = 0
    gsm8k_shots: int = 5
    gsm8k_max_tokens: int = 512
    gsm8k_format: str = "chat"
    gsm8k_data: str | None = None  # test.jsonl (train.jsonl beside it); None: the hub, cached
    overrides: list[str] = field(default_factory=list)  # applied to every step, after the ladder's

    def identity(self) -> dict[str, Any]:
        return {"bench": asdict(self.bench), "gsm8k": {"questions": self.gsm8k_questions, "shots": self.gsm8k_shots,
                                                       "max_tokens": self.gsm8k_max_tokens, "format": self.gsm8k_format,
                                                       "data": self.gsm8k_data},
                "overrides": list(self.overrides)}


def settings_for(ladder: Ladder, **overrides: Any) -> LadderSettings:
    """The ladder file's settings with the command line's (None = the file's) over them."""
    b, g = ladder.spec.bench, ladder.spec.gsm8k
    pick = lambda key, default: default if overrides.get(key) is None else overrides[key]  # noqa: E731
    bench = BenchConfig(input_len=pick("input_len", b.input_len), output_len=pick("output_len", b.output_len),
                        num_prompts=pick("num_prompts", b.num_prompts), warmup=pick("warmup", b.warmup),
                        seed=pick("seed", b.seed), dataset=pick("dataset", b.dataset))
    return LadderSettings(bench, pick("gsm8k_questions", g.questions), pick("gsm8k_shots", g.shots),
                          pick("gsm8k_max_tokens", g.max_tokens), pick("gsm8k_format", g.format),
                          overrides.get("gsm8k_data"), list(ladder.spec.set) + list(overrides.get("overrides") or []))


@dataclass
class StepRecord:
    index: int
    label: str
    recipe: str
    overrides: list[str]
    status: str = PENDING
    error: str | None = None
    run_id: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    failed_checks: list[str] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    tpot_per_request_ms: list[float] = field(default_factory=list)
    bench_file: str | None = None
    gsm8k_file: str | None = None
    gsm8k: dict[str, Any] | None = None
    published: dict[str, Any] | None = None

    @property
    def identity(self) -> dict[str, Any]:
        return {"label": self.label, "recipe": self.recipe, "overrides": self.overrides}


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def published_figure(recipe_name: str, overrides: list[str]) -> dict[str, Any] | None:
    """The study's figure for this recipe as shipped (no override changes it), its first listed
    workload (the synthetic one)."""
    from sparkit.roofline.published import PUBLISHED

    if overrides:
        return None
    for figure in PUBLISHED:
        if figure.recipe == recipe_name and not figure.overrides:
            return {"tok_s": figure.tok_s, "decode_tok_s": figure.decode_tok_s, "accept": figure.accept,
                    "workload": figure.workload, "source": figure.source}
    return None


# ------------------------------------------------------------------ what each step bought


def comparison(steps: list[StepRecord]) -> list[dict[str, Any]]:
    """Per step: its decode speed against the previous measured step and the first (ratio, and
    the noise of the difference relative to the previous), its GSM8K answers against the first
    step's (McNemar), and the published figure's own ratio to the previous published one."""
    from sparkit.bench.tune import difference_noise

    out = []
    measured = [s for s in steps if s.status in FINISHED and s.figures.get("decode_tok_s")]
    first = measured[0] if measured else None
    previous: StepRecord | None = None
    previous_published: float | None = None
    for step in steps:
        row: dict[str, Any] = {"index": step.index, "vs_previous": None, "vs_previous_noise": None, "vs_first": None,
                               "gsm8k_vs_first": None, "published_vs_previous": None}
        tok_s = step.figures.get("decode_tok_s") if step.status in FINISHED else None
        if tok_s and previous is not None:
            row["vs_previous"] = tok_s / previous.figures["decode_tok_s"]
            noise = difference_noise(previous.tpot_per_request_ms, step.tpot_per_request_ms)
            tpot = step.figures.get("tpot_mean_ms")
            if noise is not None and tpot:
                row["vs_previous_noise"] = noise / tpot  # relative: the speed ratio's own noise
        if tok_s and first is not None and step is not first:
            row["vs_first"] = tok_s / first.figures["decode_tok_s"]
        if step.gsm8k_file and first is not None and first.gsm8k_file and step is not first:
            row["gsm8k_vs_first"] = _mcnemar(first.gsm8k_file, step.gsm8k_file)
        published = (step.published or {}).get("tok_s")
        if published and previous_published:
            row["published_vs_previous"] = published / previous_published
        if published:
            previous_published = published
        if tok_s:
            previous = step
        out.append(row)
    return out


def _mcnemar(a: str, b: str) -> dict[str, Any] | None:
    from sparkit.evals.compare import compare_files

    try:
        doc = compare_files(Path(a), Path(b))
    except SparkitError as exc:
        return {"error": exc.message}
    return {"n_paired": doc["n_paired"], "mcnemar_p": doc["mcnemar_p"], "verdict": doc["verdict"],
            "first_accuracy": doc["metrics"][doc["metric"]]["a"]["value"],
            "accuracy": doc["metrics"][doc["metric"]]["b"]["value"]}


# ------------------------------------------------------------------ running it


StepFn = Callable[[StepRecord, int, bool], None]  # (step, total, starting) when a step starts and when it ends
ProgressFn = Callable[[str, int, int], None]


def _write(path: Path, doc: dict[str, Any]) -> None:
    from sparkit.paths import ensure_dir, write_atomic

    ensure_dir(path.parent)
    write_atomic(path, json.dumps(doc, indent=1, default=str))


def new_document(ladder: Ladder, settings: LadderSettings) -> dict[str, Any]:
    steps = [StepRecord(i, s.label or s.recipe, s.recipe, list(settings.overrides) + list(s.set))
             for i, s in enumerate(ladder.spec.steps)]
    return {"kind": LADDER_KIND, "ladder": ladder.name, "source": ladder.source,
            "description": ladder.spec.description, "settings": settings.identity(),
            "steps": [asdict(s) for s in steps], "comparison": [], "complete": False,
            "started_at": _now(), "finished_at": None}


def read_document(path: Path) -> dict[str, Any]:
    """A ladder document `run_ladder` wrote (DataError, exit 8, for anything else)."""
    from sparkit.errors import DataError

    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: no such ladder document", hint="`sparkit ladder --out FILE` writes one") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a ladder document ({exc})", hint="a file `sparkit ladder --out` wrote") from None
    if not isinstance(doc, dict) or doc.get("kind") != LADDER_KIND or not isinstance(doc.get("steps"), list):
        raise DataError(f"{path}: not a ladder document (no kind={LADDER_KIND!r})",
                        hint="a file `sparkit ladder --out` wrote")
    return _reconciled(doc)


def _reconciled(doc: dict[str, Any]) -> dict[str, Any]:
    """A document whose ladder is gone without finishing it (SIGKILL, a crash): a step it was
    running is interrupted, not running."""
    from sparkit.runs.processes import ProcessIdentity

    owner = ProcessIdentity.from_dict(doc.get("owner"))
    if doc.get("complete") or owner is None or owner.alive():
        return doc
    for step in doc["steps"]:
        if isinstance(step, dict) and step.get("status") == RUNNING:
            step["status"] = INTERRUPTED
            step["error"] = f"`sparkit ladder` (pid {owner.pid}) ended while this step ran"
    return doc


def resume_document(path: Path, fresh: dict[str, Any]) -> dict[str, Any]:
    """The document at `path`, checked to be the same ladder with the same settings."""
    old = read_document(path)
    differs = [k for k in ("ladder", "settings") if old.get(k) != fresh[k]]
    old_steps = [{k: s.get(k) for k in ("label", "recipe", "overrides")} for s in old.get("steps", [])]
    new_steps = [{k: s[k] for k in ("label", "recipe", "overrides")} for s in fresh["steps"]]
    if old_steps != new_steps:
        differs.append("steps")
    if differs:
        raise UsageError(f"cannot resume {path}: it was made with another {' and '.join(differs)}",
                         hint="rerun with the same ladder and flags, or start a new file with --out")
    return old


def run_ladder(ladder: Ladder, settings: LadderSettings, *, out_path: Path, resume: bool = False,
               on_step: StepFn | None = None, on_progress: ProgressFn | None = None,
               launch_timeout: float = 600) -> dict[str, Any]:
    """Run every step not finished yet; return the document (also kept up to date at out_path)."""
    doc = new_document(ladder, settings)
    if out_path.exists():
        if not resume:
            raise UsageError(f"{out_path} already exists", hint="--resume continues it; or --out another file")
        doc = resume_document(out_path, doc)
    steps = [StepRecord(**s) for s in doc["steps"]]
    for step in steps:  # every step's recipe loads before any server starts
        _load(step)
    doc["owner"] = _this_process()  # a document left by a ladder that was killed reads as interrupted

    def save() -> None:
        doc["steps"] = [asdict(s) for s in steps]
        doc["comparison"] = comparison(steps)
        _write(out_path, doc)

    save()
    for step in steps:
        if step.status in FINISHED:
            continue
        if on_step:
            on_step(step, len(steps), True)
        try:
            interrupts.raise_if_pending()  # one the interpreter swallowed between steps
            _run_step(step, settings, out_path, save, on_progress, launch_timeout)
            interrupts.raise_if_pending()
        except KeyboardInterrupt:
            # Recorded whole, whatever signal comes meanwhile: the document is what --resume reads.
            with interrupts.deferred():
                step.status, step.finished_at = INTERRUPTED, _now()
                step.error = f"interrupted ({interrupts.describe(interrupts.received())})"
                save()
            interrupts.clear()
            raise
        save()
        if on_step:
            on_step(step, len(steps), False)
    doc["complete"] = all(s.status in FINISHED or s.status == FAILED for s in steps)
    doc["finished_at"] = _now()
    save()
    return doc


def _this_process() -> dict[str, Any] | None:
    from sparkit.runs.processes import ProcessIdentity

    identity = ProcessIdentity.of(os.getpid())
    return identity.to_dict() if identity else None


def _load(step: StepRecord):
    from sparkit.recipes.load import load_recipe

    return load_recipe(step.recipe, step.overrides)


def step_file(out_path: Path, step: StepRecord, suffix: str) -> Path:
    """Beside the ladder document: `<stem>-step2-FP8-experts.bench.json`."""
    import re

    safe = re.sub(r"[^A-Za-z0-9._]+", "-", step.label).strip("-")[:40] or "step"
    return out_path.with_name(f"{out_path.stem}-step{step.index + 1}-{safe}{suffix}")


def _run_step(step: StepRecord, settings: LadderSettings, out_path: Path, save: Callable[[], None],
              on_progress: ProgressFn | None, launch_timeout: float) -> None:
    from sparkit import runs
    from sparkit.bench.runner import run_bench
    from sparkit.bench.tune import per_request
    from sparkit.planning.compile import compile_plan

    step.status, step.error, step.started_at, step.finished_at = RUNNING, None, _now(), None
    step.failed_checks, step.checks, step.figures, step.gsm8k = [], [], {}, None
    save()
    loaded = _load(step)
    step.published = published_figure(loaded.name, step.overrides)
    bench_path, gsm8k_path = step_file(out_path, step, ".bench.json"), step_file(out_path, step, ".gsm8k.jsonl")
    for stale in (bench_path, gsm8k_path, gsm8k_path.with_name(gsm8k_path.stem + ".summary.json")):
        stale.unlink(missing_ok=True)  # a new server: an earlier attempt's partial figures are not its own
    try:
        plan = compile_plan(loaded, port=runs.free_port())  # transient: never clash with a running server
        with runs.transient_server(plan, timeout=launch_timeout, checks=True) as started:
            step.run_id = started.run.id
            step.checks = [c.to_dict() for c in started.checks]
            step.failed_checks = [c.name for c in started.failed_checks]
            step.figures.update(_check_figures(started.checks))
            save()
            server = started.server
            bench_doc = asyncio.run(run_bench(
                server.url, settings.bench, api_key=server.api_key, out_path=bench_path, recipe=plan.recipe,
                run_id=started.run.id,
                on_progress=(lambda phase, d, t: on_progress(f"step {step.index + 1} {phase}", d, t)) if on_progress else None))
            step.bench_file = str(bench_path)
            figures = bench_doc["summary"]["figures"]
            requests = [r for rep in bench_doc.get("repeats", []) for r in rep.get("requests", [])]
            if requests and all(r.get("error") for r in requests):
                raise _StepError(f"every benchmark request failed; the first: {requests[0]['error']}")
            tpot = figures.get("tpot_mean_ms")
            step.figures.update({
                "decode_tok_s": 1000.0 / tpot if tpot else None, "tpot_mean_ms": tpot,
                "output_throughput_tok_s": figures.get("output_throughput_tok_s"),
                "accept_length": figures.get("accept_length_mean") or step.figures.get("probe_accept_length"),
                "bandwidth_limit_tok_s": (bench_doc.get("limit") or {}).get("limit_tok_s"),
            })
            step.tpot_per_request_ms = per_request(bench_doc)[0]
            save()
            if settings.gsm8k_questions:
                step.gsm8k_file = str(gsm8k_path)
                step.gsm8k = _gsm8k(server.url, server.api_key, settings, gsm8k_path, loaded.name, started.run.id,
                                    on_progress, step)
        step.status = CHECKS_FAILED if step.failed_checks else DONE
    except (SparkitError, _StepError) as exc:
        step.status, step.error = FAILED, str(exc)
    step.finished_at = _now()


class _StepError(Exception):
    """A step that ran but measured nothing (its figures so far are kept)."""


def _check_figures(checks: list) -> dict[str, Any]:
    """What the startup checks measured: the probe's accept length and decode speed, the known
    answer's perplexity."""
    by_name = {c.name: c for c in checks}
    out: dict[str, Any] = {}
    if "acceptance" in by_name:
        out["probe_accept_length"] = by_name["acceptance"].data.get("accept_length")
    if "decode_speed" in by_name:
        out["probe_decode_tok_s"] = by_name["decode_speed"].data.get("decode_tok_s")
    if "known_answer" in by_name:
        out["perplexity"] = by_name["known_answer"].data.get("perplexity")
        out["reference_perplexity"] = by_name["known_answer"].data.get("expected")
    return out


def _gsm8k(url: str, api_key: str | None, settings: LadderSettings, path: Path, recipe: str, run_id: str,
           on_progress: ProgressFn | None, step: StepRecord) -> dict[str, Any]:
    from sparkit.evals.gsm8k.data import load_dataset
    from sparkit.evals.gsm8k.eval_settings import EvalSettings
    from sparkit.evals.gsm8k.evaluate import EvalRequest, run_eval
    from sparkit.evals.gsm8k.prompts import choose_exemplars

    dataset = load_dataset(Path(settings.gsm8k_data) if settings.gsm8k_data else None,
                           need_train=settings.gsm8k_shots > 0)
    questions = dataset.test[: settings.gsm8k_questions]
    exemplars = choose_exemplars(dataset.train, settings.gsm8k_shots, exclude=questions)
    eval_settings = EvalSettings(data_sha256=dataset.sha256, shots=settings.gsm8k_shots, format=settings.gsm8k_format,
                                 temperature=0.0, top_p=1.0, top_k=-1, max_tokens=settings.gsm8k_max_tokens,
                                 exemplar_ids=[e.id for e in exemplars])
    request = EvalRequest(url=url, settings=eval_settings, questions=questions, exemplars=exemplars, out=path,
                          api_key=api_key, recipe=recipe, run_id=run_id, data_path=str(dataset.test_path))

    def said(p: Any) -> None:
        if on_progress:
            on_progress(f"step {step.index + 1} gsm8k", p.done, p.total)

    summary = asyncio.run(run_eval(request, said))
    return {"n": summary["n"], "accuracy": summary["accuracy"]["flexible"]["value"],
            "accuracy_strict": summary["accuracy"]["strict"]["value"], "mean_latency_s": summary["mean_latency_s"]}


def latest_document(ladder_name: str) -> Path | None:
    """The newest ladder document of this ladder in the default directory (for --resume without --out)."""
    directory = default_directory()
    found = []
    for path in directory.glob("*.json"):
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(doc, dict) and doc.get("kind") == LADDER_KIND and doc.get("ladder") == ladder_name:
            found.append((path.stat().st_mtime, path))
    return max(found)[1] if found else None


def default_directory() -> Path:
    from sparkit.paths import data_dir

    return data_dir() / "ladder"


def default_out(ladder_name: str) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(ladder_name).stem)[:40] or "ladder"
    return default_directory() / f"{stamp}-{safe}.json"


def fmt_ratio(ratio: float | None) -> str:
    return "-" if ratio is None or not math.isfinite(ratio) else f"{ratio - 1:+.1%}"
