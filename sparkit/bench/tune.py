"""`sparkit tune`: sweep recipe parameters, engine environment variables and engine flags (the
grammar: sparkit.bench.tune_params), one server per point, and pick the best.

For each combination of `--param` values the recipe is loaded with those overrides and planned
before any server starts (the engine's own parser judges every flag), then started through the
`up` pipeline (sparkit.runs.transient_server: preflight, build, launch, wait, startup checks).
Batch-1 comparisons on one machine are sound only one server at a time (issue 38: with several
servers up, a 15% gain of the FP8 head read as within noise), so by default the points run one
after another in A/B/A order: the first point (the baseline) first, every other point, then the
baseline again; how far the baseline moved between its two runs is part of the noise band.
`interleave=True` keeps every point up at once and benchmarks them interleaved prompt by prompt,
and the sweep document says loudly that the comparison is then unsound. The sweep file is
rewritten as points finish (each point's bench file after every repeat), so an interrupted sweep
keeps what it measured and re-running the same command skips the points already done.

A point is rejected, never recommended, when what ran is not what its recipe asks for (a startup
check failed, the known answer among them) and when it changes greedy outputs: each point's
greedy outputs on a few fixed prompts must be byte-identical to the baseline's unless the two
recipes differ in a key that changes rounding (sparkit.bench.verify.rounding_changes). A switch
that makes the engine faster by computing something else is a loss, and named as one.

Ranking: mean TPOT first (what a user waits per token; with speculation it is step time / accept
length); points whose TPOT is within the noise band of the best are ordered by the step-time
estimate (a cheaper step is more robust when the real workload accepts fewer drafts than the
synthetic one). "Measurably better" than the baseline means the TPOT difference exceeds the noise
band: twice the standard error of the difference, paired over the same prompts (every point gets
the same prompts), or the baseline's own drift between its A/B/A runs, whichever is larger.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkit.bench.metrics import RequestTimeline, mean, stdev
from sparkit.bench.runner import BenchConfig, BenchTarget, run_bench, run_interleaved
from sparkit.bench.tune_params import SweepParam, grid, overrides_for, parse_params, point_label
from sparkit.errors import RecipeError, SparkitError

TUNE_KIND = "sparkit-tune"
NOISE_SIGMAS = 2.0


@dataclass
class SweepPoint:
    values: dict[str, str]
    overrides: list[str]
    status: str = "pending"  # pending | done | failed
    error: str | None = None
    bench_file: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    tpot_per_request_ms: list[float] = field(default_factory=list)
    step_time_per_request_ms: list[float] = field(default_factory=list)
    # Startup checks that failed on this point's server: its figures are kept and shown, but it is
    # never recommended (what ran is not what its recipe asks for).
    startup_failed: list[str] = field(default_factory=list)
    # Its greedy outputs on the output prompts (OUTPUT_PROMPTS), and how they differ from the
    # baseline's when they do: a point that changes greedy outputs is rejected as a loss.
    greedy: list[str] = field(default_factory=list)
    output_change: str | None = None
    output_note: str | None = None  # why its outputs were not judged (rounding-changing, no baseline)

    @property
    def label(self) -> str:
        return point_label(self.values)

    @property
    def rejected(self) -> str | None:
        """Why the point may not win (None: it may)."""
        if self.startup_failed:
            return f"startup checks failed: {', '.join(self.startup_failed)}"
        if self.output_change:
            return f"changes greedy outputs: {self.output_change}"
        return None


def per_request(doc: dict[str, Any]) -> tuple[list[float], list[float]]:
    """Per-prompt TPOT and step time, averaged over repeats (prompts are the same each repeat)."""
    repeats = [r for r in doc.get("repeats", []) if r.get("complete")]
    tpots: list[list[float]] = []
    steps: list[list[float]] = []
    for repeat in repeats:
        timelines = [RequestTimeline.from_dict(t) for t in repeat["requests"]]
        tpots.append([t.tpot * 1000 if t.tpot is not None else math.nan for t in timelines])
        steps.append([t.step_time * 1000 if t.step_time is not None else math.nan for t in timelines])

    def average(rows: list[list[float]]) -> list[float]:
        return [mean(list(col)) for col in zip(*rows)] if rows else []

    return average(tpots), average(steps)


def difference_noise(a: list[float], b: list[float]) -> float | None:
    """Twice the standard error of mean(b) - mean(a): paired when the prompts line up."""
    a = [x for x in a if math.isfinite(x)]
    b = [x for x in b if math.isfinite(x)]
    if len(a) < 2 or len(b) < 2:
        return None
    if len(a) == len(b):
        diffs = [y - x for x, y in zip(a, b)]
        return NOISE_SIGMAS * stdev(diffs) / math.sqrt(len(diffs))
    return NOISE_SIGMAS * math.sqrt(stdev(a) ** 2 / len(a) + stdev(b) ** 2 / len(b))


@dataclass
class Ranking:
    order: list[int]  # indices into points, best first
    best: int | None
    baseline: int | None  # the first point that finished (the sweep's first value)
    measurably_better: bool | None
    tpot_gain_ms: float | None  # baseline TPOT - best TPOT
    noise_ms: float | None  # the noise band the gain was judged against
    verdict: str
    drift_ms: float | None = None  # the baseline's TPOT, last run minus first (A/B/A), when it ran twice
    rejected: dict[str, str] = field(default_factory=dict)  # point label -> why it may not win


def baseline_runs(first: SweepPoint, again: SweepPoint | None) -> tuple[SweepPoint, float | None]:
    """The baseline as measured in A/B/A order: per prompt the mean of its first and last run, and
    how far its mean TPOT moved between them (None: it ran once)."""
    if again is None or again.status != "done" or first.status != "done" or not again.figures.get("tpot_mean_ms"):
        return first, None
    both = SweepPoint(first.values, first.overrides, "done", figures=dict(first.figures),
                      startup_failed=first.startup_failed, greedy=first.greedy, output_change=first.output_change)
    both.tpot_per_request_ms = [mean([x, y]) for x, y in zip(first.tpot_per_request_ms, again.tpot_per_request_ms)]
    both.step_time_per_request_ms = [mean([x, y]) for x, y in zip(first.step_time_per_request_ms, again.step_time_per_request_ms)]
    for key in ("tpot_mean_ms", "step_time_estimate_ms"):
        if first.figures.get(key) is not None and again.figures.get(key) is not None:
            both.figures[key] = mean([first.figures[key], again.figures[key]])
    return both, again.figures["tpot_mean_ms"] - first.figures["tpot_mean_ms"]


def rank(points: list[SweepPoint], again: SweepPoint | None = None) -> Ranking:
    """Best first, among the points that finished and may win; `again`: the baseline's second run
    (A/B/A), whose drift widens the noise band."""
    rejected = {p.label: p.rejected for p in points if p.status == "done" and p.rejected}
    done = [i for i, p in enumerate(points)
            if p.status == "done" and p.figures.get("tpot_mean_ms") is not None and p.label not in rejected]
    if not done:
        named = "; ".join(f"{label} ({why})" for label, why in rejected.items())
        return Ranking([], None, None, None, None, None, "no point finished" + (
            f" that may win (rejected: {named})" if named else ""), rejected=rejected)
    drift = None
    if done[0] == 0:
        points = list(points)
        points[0], drift = baseline_runs(points[0], again)

    def band(i: int, j: int) -> float | None:
        noise = difference_noise(points[i].tpot_per_request_ms, points[j].tpot_per_request_ms)
        return None if noise is None else max(noise, abs(drift) if drift is not None else 0.0)

    tpot = {i: points[i].figures["tpot_mean_ms"] for i in done}
    fastest = min(done, key=lambda i: tpot[i])
    # Within noise of the fastest, prefer the cheaper step.
    near = [i for i in done if i == fastest or ((n := band(fastest, i)) is not None and tpot[i] - tpot[fastest] <= n)]
    step = {i: points[i].figures.get("step_time_estimate_ms") or math.inf for i in done}
    order = sorted(near, key=lambda i: (step[i], tpot[i])) + sorted((i for i in done if i not in near), key=lambda i: tpot[i])
    best, baseline = order[0], done[0]
    outcome = _verdict(points, order, baseline, tpot, band)
    return Ranking(order, best, baseline, *outcome, drift_ms=drift, rejected=rejected)


def _verdict(points: list[SweepPoint], order: list[int], baseline: int, tpot: dict[int, float],
             band: Callable[[int, int], float | None]) -> tuple[bool | None, float | None, float | None, str]:
    """(measurably better, TPOT gain, noise band, the sentence) for the best point against the baseline."""
    best = order[0]
    if best == baseline:
        verdict = f"none of the other points is measurably better than {points[baseline].label}"
        if len(order) > 1:
            nxt = order[1]
            noise = band(baseline, nxt)
            verdict += (f" (runner-up {points[nxt].label}: TPOT {tpot[nxt] - tpot[baseline]:+.3f} ms"
                        + (f", noise band {noise:.3f} ms)" if noise is not None else ")"))
        return False, 0.0, None, verdict
    noise = band(baseline, best)
    gain = tpot[baseline] - tpot[best]
    if noise is None:
        return None, gain, None, f"{points[best].label} has the lowest TPOT, but noise is unknown (too few prompts)"
    if gain > noise:
        return True, gain, noise, (f"{points[best].label} is measurably better than {points[baseline].label}: TPOT "
                                   f"{tpot[best]:.3f} vs {tpot[baseline]:.3f} ms (gain {gain:.3f} ms > noise band {noise:.3f} ms)")
    return False, gain, noise, (f"no point is measurably better than {points[baseline].label}: best {points[best].label} "
                                f"gains {gain:.3f} ms TPOT, within the noise band {noise:.3f} ms")


def new_recipe_path(source: Path, label: str, directory: Path | None = None) -> Path:
    """A file name that does not exist yet: never overwrite the user's recipe."""
    directory = directory or source.parent
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in label.replace(",", "_").replace("=", ""))
    candidate = directory / f"{source.stem}-tuned-{safe}.yaml"
    n = 2
    while candidate.exists():
        candidate = directory / f"{source.stem}-tuned-{safe}-{n}.yaml"
        n += 1
    return candidate


def _shipped_name(source: Path) -> str | None:
    """The shipped name of a recipe file in sparkit's own recipes folder, else None."""
    from sparkit.paths import repo_recipes_dir

    root = repo_recipes_dir().resolve()
    try:
        rel = source.resolve().relative_to(root).with_suffix("")
    except ValueError:
        return None
    return rel.parts[-1] if len(rel.parts) == 2 and rel.parts[0] == rel.parts[1] else rel.as_posix()


def tuned_recipe_dir(source: Path, directory: Path | None = None) -> tuple[Path, str]:
    """Where the tuned recipe goes, and why: the directory asked for; else beside the recipe
    that was tuned; for a shipped recipe (never edited in place: it belongs to the install)
    the current directory."""
    if directory is not None:
        return Path(directory), "--recipe-dir"
    shipped = _shipped_name(source)
    if shipped is not None:
        return Path.cwd(), f"the current directory: {shipped} is a shipped recipe"
    return source.resolve().parent, f"beside {source.name}"


def write_best_recipe(source: Path, overrides: list[str], summary: str, directory: Path | None = None, label: str = "best",
                      switches: list[str] = ()) -> Path:
    """A recipe that `extends` the original and sets the winning values, in a new file in
    `tuned_recipe_dir(source, directory)`; `switches`: a comment line each (what won, by what figure)."""
    import yaml

    target = new_recipe_path(source, label, tuned_recipe_dir(source, directory)[0])
    tree: dict[str, Any] = {}
    for assignment in overrides:
        key, _, raw = assignment.partition("=")
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(raw)
    # A shipped recipe by its name (it moves with the install), a file beside it by its name, any
    # other by its absolute path.
    shipped = _shipped_name(source)
    extends = shipped or (source.name if target.parent.resolve() == source.parent.resolve() else str(source.resolve()))
    body = {"extends": extends, "description": f"tuned from {source.name}: {summary}"[:200], **tree}
    header = f"# Written by `sparkit tune` ({_dt.datetime.now().isoformat(timespec='seconds')}).\n"
    header += "".join(f"# {line}\n" for line in switches)
    from sparkit.paths import ensure_dir, open_output

    ensure_dir(target.parent)
    with open_output(target, "x", encoding="utf-8") as handle:  # "x": fail rather than overwrite
        handle.write(header + yaml.safe_dump(body, sort_keys=False))
    return target


def _write_json(path: Path, data: Any) -> None:
    from sparkit.paths import ensure_dir, write_atomic

    ensure_dir(path.parent)
    write_atomic(path, json.dumps(data, indent=1, default=str))


PointFn = Callable[[SweepPoint, int, int], None]  # (point, index, total) after each point


# The greedy outputs every point must reproduce (the baseline's): a few of verify's fixed prompts,
# short, so that a switch that changes numerics shows within the first tokens.
OUTPUT_PROMPTS = 4
OUTPUT_TOKENS = 48
# Said in the sweep document (and by the CLI) when points are up at once.
INTERLEAVED_WARNING = ("every point's server is up at once (--interleave): batch-1 comparisons on one machine are "
                       "unsound with several servers up (issue 38: the FP8 head's +15% read as within noise); the "
                       "default runs one server at a time, A/B/A")


def run_tune(
    recipe_ref: str,
    param_specs: list[str],
    config: BenchConfig,
    *,
    out_path: Path,
    base_overrides: list[str] | None = None,
    write_recipe_dir: Path | None = None,
    write_recipe: bool = True,
    on_point: PointFn | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
    launch_timeout: float = 600,
    interleave: bool = False,
) -> dict[str, Any]:
    """Run the sweep; return the sweep document (also kept up to date at `out_path`)."""
    from sparkit.recipes.load import load_recipe

    base_overrides = list(base_overrides or [])
    base = load_recipe(recipe_ref, base_overrides)
    params, points = planned_points(recipe_ref, param_specs, base_overrides)
    doc = _new_document(recipe_ref, base, params, base_overrides, config, interleave)
    previous = _previous_points(out_path, doc)
    for i, point in enumerate(points):
        old = previous.get(json.dumps(point.values, sort_keys=True))
        if old is not None and old.status == "done":
            points[i] = old
    again = previous.get(_AGAIN)
    sweep = _Sweep(recipe_ref, config, points, doc, out_path, on_progress, launch_timeout,
                   again if again is not None and again.status == "done" else None)
    sweep.run(interleave, on_point)
    ranking = rank(points, sweep.again)
    doc["ranking"] = asdict(ranking)
    if write_recipe and ranking.best is not None and base.path is not None:
        best = points[ranking.best]
        summary = f"{best.label} (TPOT {best.figures.get('tpot_mean_ms', math.nan):.3f} ms); {ranking.verdict}"
        doc["best_recipe"] = str(write_best_recipe(Path(base.path), best.overrides, summary,
                                                   write_recipe_dir, best.label, switches=_switch_notes(best, ranking)))
        doc["best_recipe_where"] = tuned_recipe_dir(Path(base.path), write_recipe_dir)[1]
    doc["complete"] = True
    _write_json(out_path, doc)
    return doc


_AGAIN = "baseline again"  # the key of the baseline's second run among a sweep file's points


def _new_document(recipe_ref: str, base: Any, params: list[SweepParam], base_overrides: list[str],
                  config: BenchConfig, interleave: bool) -> dict[str, Any]:
    return {
        "kind": TUNE_KIND,
        "recipe": str(base.path or recipe_ref),
        "recipe_name": base.name,
        "params": [asdict(p) for p in params],
        "base_overrides": base_overrides,
        "bench_config": asdict(config),
        "interleaved": interleave,
        # the order the servers ran in (A/B/A: the baseline first and last), and what could not be done so
        "run_order": [],
        "warnings": [INTERLEAVED_WARNING] if interleave else [],
        "points": [],
        "baseline_again": None,  # the baseline's second run (A/B/A)
        "ranking": None,
        "best_recipe": None,  # the new recipe file, once a best point is known
        "best_recipe_where": None,  # why it is in that directory
        "complete": False,
    }


def planned_points(recipe_ref: str, param_specs: list[str], base_overrides: list[str]) -> tuple[list[SweepParam], list[SweepPoint]]:
    """The sweep's parameters and points, every one planned (no server starts): a value the schema
    refuses, or a flag the engine's parser does not have, is an error naming the --param."""
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    params = parse_params(param_specs)
    base_recipe = load_recipe(recipe_ref, base_overrides).recipe
    points = [SweepPoint(values=v, overrides=base_overrides + overrides_for(v, base_recipe, params)) for v in grid(params)]

    def planned(overrides: list[str], named: str) -> None:
        try:
            compile_plan(load_recipe(recipe_ref, overrides))
        except RecipeError as exc:
            error = RecipeError(f"{named}: {exc.message}", hint=exc.hint)
            error.file, error.line, error.column, error.key = exc.file, exc.line, exc.column, exc.key
            raise error from None

    for param in params:
        for value in param.values:
            shown = f"{param.key} ({value})" if param.bare else f"{param.key}={value}"
            planned(base_overrides + overrides_for({param.key: value}, base_recipe, params), f"--param {shown}")
    if len(params) > 1:
        for point in points:
            planned(point.overrides, f"point {point.label}")
    return params, points


def _switch_notes(best: SweepPoint, ranking: Ranking) -> list[str]:
    """A comment line per value the winning point sets, with the figures that earned it."""
    noise = f", noise band {ranking.noise_ms:.3f} ms" if ranking.noise_ms is not None else ""
    figures = f"TPOT {best.figures.get('tpot_mean_ms', math.nan):.3f} ms (gain {ranking.tpot_gain_ms or 0.0:.3f} ms{noise})"
    return [f"{key}={value}: {figures}" for key, value in best.values.items()]


@dataclass
class _Sweep:
    """The points of one sweep on their way: each gets a transient server, its greedy outputs
    judged against the baseline's and a bench run, and the sweep document at `out_path` is
    rewritten after each."""

    recipe_ref: str
    config: BenchConfig
    points: list[SweepPoint]
    doc: dict[str, Any]
    out_path: Path
    on_progress: Callable[[str, int, int], None] | None
    launch_timeout: float
    again: SweepPoint | None = None  # the baseline's second run (A/B/A)

    def run(self, interleave: bool, on_point: PointFn | None) -> None:
        """The pending points: one server at a time, the baseline first and again last (A/B/A);
        or, with `interleave`, every one up at once."""
        points = self.points
        self.save()
        for index, point in enumerate(points):
            if point.status == "done" and on_point:
                on_point(point, index, len(points))
        pending = [i for i, p in enumerate(points) if p.status != "done"]
        if interleave and len(pending) > 1:
            self.bench_interleaved(pending)
        else:
            for index in pending:
                self.bench_alone(points[index])
                if on_point:
                    on_point(points[index], index, len(points))
        if interleave:
            self.say(f"no A/B/A order: {INTERLEAVED_WARNING}")
        elif len(points) > 1 and (pending or self.again is None):
            self.baseline_again()
        if interleave and on_point:
            for i in pending:
                on_point(points[i], i, len(points))

    def say(self, warning: str) -> None:
        if warning not in self.doc["warnings"]:
            self.doc["warnings"].append(warning)

    def baseline_again(self) -> None:
        """The baseline's second run, after every other point: how far it moved is part of the noise band."""
        first = self.points[0]
        if first.status != "done":
            self.say(f"no A/B/A order: the baseline {first.label} did not finish, so the sweep has no reference "
                     "run to repeat; the ranking compares the points that finished, without the drift term")
            return
        again = SweepPoint(dict(first.values), list(first.overrides))
        self.bench_alone(again, again=True)
        self.again = again if again.status == "done" else None
        if self.again is None:
            self.say(f"no A/B/A order: the baseline's second run failed ({again.error}); the noise band has no drift term")
        elif again.greedy and first.greedy and again.greedy != first.greedy:
            self.say(f"the baseline {first.label} did not reproduce its own greedy outputs on its second run: the "
                     "output gate cannot tell a switch's changes from the engine's own, so no point is rejected for "
                     "its outputs")
            for point in self.points:
                if point.output_change:
                    point.output_note, point.output_change = f"not judged: {point.output_change}", None
        self.save()

    def bench_file(self, point: SweepPoint, again: bool = False) -> Path:
        suffix = "-again" if again else ""
        return self.out_path.with_name(f"{self.out_path.stem}-{_safe(point.label)}{suffix}.json")

    def record(self, point: SweepPoint, bench_doc: dict[str, Any], path: Path) -> None:
        point.figures = bench_doc["summary"]["figures"]
        point.tpot_per_request_ms, point.step_time_per_request_ms = per_request(bench_doc)
        point.bench_file = str(path)
        point.status = "done"

    def save(self) -> None:
        self.doc["points"] = [asdict(p) for p in self.points]
        self.doc["baseline_again"] = asdict(self.again) if self.again is not None else None
        _write_json(self.out_path, self.doc)

    def start(self, point: SweepPoint, servers: contextlib.ExitStack, again: bool = False) -> Any | None:
        """A transient server for the point (stopped when `servers` closes), its startup checks and
        greedy outputs judged; None when it could not start (the point is recorded as failed)."""
        from sparkit import runs
        from sparkit.planning.compile import compile_plan
        from sparkit.recipes.load import load_recipe

        on_progress = self.on_progress
        try:
            loaded = load_recipe(self.recipe_ref, point.overrides)
            plan = compile_plan(loaded, port=runs.free_port())  # transient server: never clash with a running one
            if on_progress:
                on_progress(f"start {point.label}", 0, 1)
            started = servers.enter_context(runs.transient_server(plan, timeout=self.launch_timeout, checks=True))
            point.startup_failed = [r.name for r in started.failed_checks]
            self.doc["run_order"].append(point.label + (" (baseline again)" if again else ""))
            point.greedy = greedy_outputs(started.server.url, started.server.api_key)
            if not again:
                self.judge_outputs(point, loaded)
            if on_progress:
                on_progress(f"start {point.label}", 1, 1)
            return started
        except SparkitError as exc:
            point.status, point.error = "failed", str(exc)
            return None

    def judge_outputs(self, point: SweepPoint, loaded: Any) -> None:
        """Against the baseline's greedy outputs: equal, or the point changes outputs (a loss), or
        not judged (a rounding-changing difference between the recipes, or no baseline outputs)."""
        from sparkit.bench.verify import rounding_changes
        from sparkit.recipes.load import load_recipe

        baseline = self.points[0]
        if point is baseline:
            return
        if not baseline.greedy:
            point.output_note = f"not judged: the baseline {baseline.label} gave no greedy outputs"
            return
        rounding = rounding_changes(load_recipe(self.recipe_ref, baseline.overrides).recipe.model_dump(mode="json"),
                                    loaded.recipe.model_dump(mode="json"))
        differ = [i for i, (a, b) in enumerate(zip(baseline.greedy, point.greedy)) if a != b]
        if rounding:
            point.output_note = (f"not judged: {'; '.join(rounding)} changes rounding "
                                 f"({len(point.greedy) - len(differ)} of {len(point.greedy)} outputs identical)")
        elif differ:
            first = differ[0]
            a, b = baseline.greedy[first], point.greedy[first]
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            point.output_change = (f"{len(differ)} of {len(point.greedy)} greedy {OUTPUT_TOKENS}-token outputs differ "
                                   f"from {baseline.label}'s (prompt {first} from character {at}: "
                                   f"{a[at:at + 16]!r} vs {b[at:at + 16]!r})")

    def bench_interleaved(self, pending: list[int]) -> None:
        """Every pending point's server up at once, benched in one run interleaved request by request."""
        points = self.points
        started: dict[int, Any] = {}
        try:
            with contextlib.ExitStack() as servers:
                for i in pending:
                    got = self.start(points[i], servers)
                    if got is not None:
                        started[i] = got
                self.save()
                targets = [BenchTarget(s.server.url, s.server.api_key, self.bench_file(points[i]), s.plan.recipe, s.run.id)
                           for i, s in started.items()]
                if targets:
                    docs = asyncio.run(run_interleaved(targets, self.config, on_progress=self.on_progress))
                    for i, bench_doc in zip(started, docs):
                        self.record(points[i], bench_doc, self.bench_file(points[i]))
        except SparkitError as exc:
            for i in started:
                points[i].status, points[i].error = "failed", str(exc)
        finally:
            self.save()

    def bench_alone(self, point: SweepPoint, again: bool = False) -> None:
        """One point: its server, its bench run, the server stopped."""
        on_progress = self.on_progress
        try:
            with contextlib.ExitStack() as servers:
                got = self.start(point, servers, again)
                if got is not None:
                    path = self.bench_file(point, again)
                    label = point.label + (" again" if again else "")
                    bench_doc = asyncio.run(
                        run_bench(got.server.url, self.config, api_key=got.server.api_key, out_path=path,
                                  recipe=got.plan.recipe, run_id=got.run.id,
                                  on_progress=(lambda ph, d, t, _l=label: on_progress(f"{_l} {ph}", d, t)) if on_progress else None)
                    )
                    self.record(point, bench_doc, path)
        except SparkitError as exc:
            point.status, point.error = "failed", str(exc)
        finally:
            self.save()


def greedy_outputs(url: str, api_key: str | None) -> list[str]:
    """The server's greedy outputs on the output prompts (what every point must reproduce)."""
    from sparkit.bench.verify import VERIFY_PROMPTS, collect_outputs

    side = asyncio.run(collect_outputs(url, api_key=api_key, prompts=VERIFY_PROMPTS[:OUTPUT_PROMPTS],
                                       max_new_tokens=OUTPUT_TOKENS, pollution_rerun=False, teacher_forcing=False))
    return [g.text for g in side.greedy]


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)


def _previous_points(path: Path, doc: dict[str, Any]) -> dict[str, SweepPoint]:
    """Finished points of an earlier run of the same sweep (same recipe, params, bench settings)."""
    if not path.exists():
        return {}
    try:
        old = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    same = all(old.get(k) == doc[k] for k in ("kind", "recipe", "base_overrides", "bench_config", "interleaved"))
    if not same:
        return {}
    found = {}
    for raw in old.get("points", []):
        try:
            point = SweepPoint(**raw)
        except TypeError:
            continue
        found[json.dumps(point.values, sort_keys=True)] = point
    if isinstance(old.get("baseline_again"), dict):
        with contextlib.suppress(TypeError):
            found[_AGAIN] = SweepPoint(**old["baseline_again"])
    return found
