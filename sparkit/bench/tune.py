"""`sparkit tune`: sweep recipe parameters, one server per point, and pick the best.

For each combination of `--param KEY=v1,v2,...` values the recipe is loaded with
those overrides and started through the `up` pipeline (sparkit.runs.transient_server: preflight, build, launch, wait). By default all points are up
at once and benchmarked interleaved, prompt by prompt (one request in flight at
a time), so that load drifting on a shared machine hits every point alike;
`interleave=False` runs them one after another (one server at a time). The
sweep file is rewritten as points finish (each point's bench file after every
repeat), so an interrupted sweep keeps what it measured and re-running the
same command skips the points already done.

Ranking: mean TPOT first (what a user waits per token; with speculation it is
step time / accept length); points whose TPOT is within noise of the best are
ordered by the step-time estimate (a cheaper step is more robust when the real
workload accepts fewer drafts than the synthetic one). "Measurably better"
than the first point means the TPOT difference exceeds twice its standard
error, paired over the same prompts (every point gets the same prompts).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkit.bench.metrics import RequestTimeline, mean, stdev
from sparkit.bench.runner import BenchConfig, BenchTarget, run_bench, run_interleaved
from sparkit.errors import SparkitError, UsageError

TUNE_KIND = "sparkit-tune"
NOISE_SIGMAS = 2.0
_TOP_LEVEL = {"extends", "description", "engine", "model", "target", "stack", "server", "checks"}
_STACK_KEYS = {"weights", "quantization", "moe_backend", "lm_head", "speculative", "attention_backend", "tp", "ep"}


@dataclass
class SweepParam:
    key: str  # the recipe key path as given, e.g. speculative.num_steps
    values: list[str]


def parse_params(specs: list[str]) -> list[SweepParam]:
    """`KEY=v1,v2,...` strings to parameters; values stay YAML text (as for --set)."""
    if not specs:
        raise UsageError("tune needs at least one --param", hint="e.g. --param speculative.num_steps=1,2,3,4")
    params: list[SweepParam] = []
    for spec in specs:
        key, sep, raw = spec.partition("=")
        values = [v.strip() for v in raw.split(",") if v.strip()]
        if not sep or not key.strip() or not values:
            raise UsageError(f"--param {spec!r}: expected KEY=VALUE[,VALUE...]", hint="e.g. --param speculative.num_steps=1,2,3,4")
        if any(p.key == key.strip() for p in params):
            raise UsageError(f"--param {key.strip()!r} is given twice")
        params.append(SweepParam(key.strip(), values))
    return params


def recipe_key(key: str) -> str:
    """Accept `speculative.num_steps` as short for `stack.speculative.num_steps`."""
    head = key.split(".", 1)[0]
    if head not in _TOP_LEVEL and head in _STACK_KEYS:
        return f"stack.{key}"
    return key


def grid(params: list[SweepParam]) -> list[dict[str, str]]:
    return [dict(zip([p.key for p in params], combo)) for combo in itertools.product(*(p.values for p in params))]


def overrides_for(point: dict[str, str], base_recipe: Any) -> list[str]:
    """--set assignments for one point. Sweeping NEXTN num_steps implies the method and,
    for a chain (eagle_topk 1), num_draft_tokens = num_steps + 1, unless swept too."""
    sets = {recipe_key(k): v for k, v in point.items()}
    steps_key = "stack.speculative.num_steps"
    if steps_key in sets:
        spec = getattr(getattr(base_recipe, "stack", None), "speculative", None)
        method = getattr(spec, "method", "none")
        if method == "none" and "stack.speculative.method" not in sets:
            sets["stack.speculative.method"] = "nextn"
        topk = sets.get("stack.speculative.eagle_topk", getattr(spec, "eagle_topk", None))
        if str(topk) in ("1", "None") and "stack.speculative.num_draft_tokens" not in sets:
            sets["stack.speculative.eagle_topk"] = "1"
            sets["stack.speculative.num_draft_tokens"] = str(int(sets[steps_key]) + 1)
    return [f"{k}={v}" for k, v in sets.items()]


def point_label(point: dict[str, str]) -> str:
    return ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in point.items())


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

    @property
    def label(self) -> str:
        return point_label(self.values)


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
    noise_ms: float | None
    verdict: str


def rank(points: list[SweepPoint]) -> Ranking:
    done = [i for i, p in enumerate(points)
            if p.status == "done" and p.figures.get("tpot_mean_ms") is not None and not p.startup_failed]
    if not done:
        inactive = [p.label for p in points if p.startup_failed]
        return Ranking([], None, None, None, None, None, "no point finished" + (
            f" with its startup checks passing (failed: {', '.join(inactive)})" if inactive else ""))
    tpot = {i: points[i].figures["tpot_mean_ms"] for i in done}
    fastest = min(done, key=lambda i: tpot[i])
    # Within noise of the fastest, prefer the cheaper step.
    near = []
    for i in done:
        noise = difference_noise(points[fastest].tpot_per_request_ms, points[i].tpot_per_request_ms)
        if i == fastest or (noise is not None and tpot[i] - tpot[fastest] <= noise):
            near.append(i)
    step = {i: points[i].figures.get("step_time_estimate_ms") or math.inf for i in done}
    near_sorted = sorted(near, key=lambda i: (step[i], tpot[i]))
    rest = sorted((i for i in done if i not in near), key=lambda i: tpot[i])
    order = near_sorted + rest
    best, baseline = order[0], done[0]
    if best == baseline:
        verdict = f"none of the other points is measurably better than {points[baseline].label}"
        if len(order) > 1:
            nxt = order[1]
            noise = difference_noise(points[baseline].tpot_per_request_ms, points[nxt].tpot_per_request_ms)
            verdict += (f" (runner-up {points[nxt].label}: TPOT {tpot[nxt] - tpot[baseline]:+.3f} ms"
                        + (f", noise {noise:.3f} ms)" if noise is not None else ")"))
        return Ranking(order, best, baseline, False, 0.0, None, verdict)
    noise = difference_noise(points[baseline].tpot_per_request_ms, points[best].tpot_per_request_ms)
    gain = tpot[baseline] - tpot[best]
    if noise is None:
        return Ranking(order, best, baseline, None, gain, None,
                       f"{points[best].label} has the lowest TPOT, but noise is unknown (too few prompts)")
    if gain > noise:
        verdict = (f"{points[best].label} is measurably better than {points[baseline].label}: "
                   f"TPOT {tpot[best]:.3f} vs {tpot[baseline]:.3f} ms (gain {gain:.3f} ms > noise {noise:.3f} ms)")
        return Ranking(order, best, baseline, True, gain, noise, verdict)
    verdict = (f"no point is measurably better than {points[baseline].label}: best {points[best].label} gains "
               f"{gain:.3f} ms TPOT, within noise {noise:.3f} ms")
    return Ranking(order, best, baseline, False, gain, noise, verdict)


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


def write_best_recipe(source: Path, overrides: list[str], summary: str, directory: Path | None = None, label: str = "best") -> Path:
    """A recipe that `extends` the original and sets the winning values, in a new file in
    `tuned_recipe_dir(source, directory)`."""
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
    interleave: bool = True,
) -> dict[str, Any]:
    """Run the sweep; return the sweep document (also kept up to date at `out_path`)."""
    from sparkit.recipes.load import load_recipe

    params = parse_params(param_specs)
    base_overrides = list(base_overrides or [])
    base = load_recipe(recipe_ref, base_overrides)
    points = [SweepPoint(values=v, overrides=base_overrides + overrides_for(v, base.recipe)) for v in grid(params)]
    for point in points:  # fail fast on a bad value, before any server starts
        load_recipe(recipe_ref, point.overrides)

    doc: dict[str, Any] = {
        "kind": TUNE_KIND,
        "recipe": str(base.path or recipe_ref),
        "recipe_name": base.name,
        "params": [asdict(p) for p in params],
        "base_overrides": base_overrides,
        "bench_config": asdict(config),
        "interleaved": interleave,
        "points": [],
        "ranking": None,
        "best_recipe": None,  # the new recipe file, once a best point is known
        "best_recipe_where": None,  # why it is in that directory
        "complete": False,
    }
    previous = _previous_points(out_path, doc)
    for i, point in enumerate(points):
        old = previous.get(json.dumps(point.values, sort_keys=True))
        if old is not None and old.status == "done":
            points[i] = old
    sweep = _Sweep(recipe_ref, config, points, doc, out_path, on_progress, launch_timeout)
    sweep.save()

    for index, point in enumerate(points):
        if point.status == "done" and on_point:
            on_point(point, index, len(points))
    pending = [i for i, p in enumerate(points) if p.status != "done"]
    if interleave and len(pending) > 1:
        sweep.bench_interleaved(pending)
        for i in pending:
            if on_point:
                on_point(points[i], i, len(points))
    else:
        for index in pending:
            sweep.bench_alone(points[index])
            if on_point:
                on_point(points[index], index, len(points))

    ranking = rank(points)
    doc["ranking"] = asdict(ranking)
    if write_recipe and ranking.best is not None and base.path is not None:
        best = points[ranking.best]
        summary = f"{best.label} (TPOT {best.figures.get('tpot_mean_ms', math.nan):.3f} ms); {ranking.verdict}"
        doc["best_recipe"] = str(write_best_recipe(Path(base.path), best.overrides, summary, write_recipe_dir, best.label))
        doc["best_recipe_where"] = tuned_recipe_dir(Path(base.path), write_recipe_dir)[1]
    doc["complete"] = True
    _write_json(out_path, doc)
    return doc


@dataclass
class _Sweep:
    """The points of one sweep on their way: each gets a transient server and a bench run, and
    the sweep document at `out_path` is rewritten after each."""

    recipe_ref: str
    config: BenchConfig
    points: list[SweepPoint]
    doc: dict[str, Any]
    out_path: Path
    on_progress: Callable[[str, int, int], None] | None
    launch_timeout: float

    def bench_file(self, point: SweepPoint) -> Path:
        return self.out_path.with_name(f"{self.out_path.stem}-{_safe(point.label)}.json")

    def record(self, point: SweepPoint, bench_doc: dict[str, Any], path: Path) -> None:
        point.figures = bench_doc["summary"]["figures"]
        point.tpot_per_request_ms, point.step_time_per_request_ms = per_request(bench_doc)
        point.bench_file = str(path)
        point.status = "done"

    def save(self) -> None:
        self.doc["points"] = [asdict(p) for p in self.points]
        _write_json(self.out_path, self.doc)

    def start(self, point: SweepPoint, servers: contextlib.ExitStack) -> Any | None:
        """A transient server for the point (stopped when `servers` closes); None when it could
        not start (the point is recorded as failed)."""
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
            if on_progress:
                on_progress(f"start {point.label}", 1, 1)
            return started
        except SparkitError as exc:
            point.status, point.error = "failed", str(exc)
            return None

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

    def bench_alone(self, point: SweepPoint) -> None:
        """One point: its server, its bench run, the server stopped."""
        on_progress = self.on_progress
        try:
            with contextlib.ExitStack() as servers:
                got = self.start(point, servers)
                if got is not None:
                    path = self.bench_file(point)
                    bench_doc = asyncio.run(
                        run_bench(got.server.url, self.config, api_key=got.server.api_key, out_path=path,
                                  recipe=got.plan.recipe, run_id=got.run.id,
                                  on_progress=(lambda ph, d, t, _l=point.label: on_progress(f"{_l} {ph}", d, t)) if on_progress else None)
                    )
                    self.record(point, bench_doc, path)
        except SparkitError as exc:
            point.status, point.error = "failed", str(exc)
        finally:
            self.save()

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
    return found
