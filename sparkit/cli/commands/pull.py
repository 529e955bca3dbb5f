"""`sparkit pull`: a recipe's model (or a hub id) into the Hugging Face cache, verified, with
progress (parse, call sparkit.hub.pull, render)."""

from __future__ import annotations

import shlex
import sys
import threading
import time
from typing import Any

import typer

from sparkit import interrupts
from sparkit.cli import options
from sparkit.cli.common import err_console, is_terminal, print_json


def pull(
    refs: list[str] = typer.Argument(None, help="Recipes (files or shipped names) or hub ids: ORG/NAME, or ORG/NAME@REVISION (a branch, tag or commit)."),
    set_: options.Overrides = (),
    check: bool = typer.Option(False, "--check", help="Verify the local copy against the hub's hashes; download nothing."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the files, their sizes and what is here; download nothing."),
    list_: bool = typer.Option(False, "--list", help="List the models sparkit pulled (repository, commit, files, size, page cache)."),
    workers: int = typer.Option(4, "--workers", min=1, max=32, help="Files downloaded at once."),
    ignore_fit: bool = typer.Option(False, "--ignore-fit", help="Download a recipe's model even when its memory fit says it does not fit here."),
    as_json: options.Json = False,
) -> None:
    """HF_TOKEN (or `hf auth login`) for gated and private repositories; HF_ENDPOINT for a mirror;
    HF_HUB_CACHE for where the files go; HF_HUB_OFFLINE=1 to check a copy without the network."""
    from sparkit.errors import DataError, UsageError
    from sparkit.hub.pull import check_room, plan_pull, run_pull

    if list_:
        return _list(as_json)
    if not refs:
        raise UsageError("name a recipe or a hub id", hint="e.g. `sparkit pull ling-3.0-flash/spark-optimized` or "
                                                          "`sparkit pull inclusionAI/Ling-3.0-flash-fp4`")
    if check and dry_run:
        raise UsageError("--check and --dry-run: choose one (--check verifies, --dry-run only lists)")
    command = "sparkit pull " + shlex.join([*refs, *(a for s in set_ for a in ("--set", s))])
    from sparkit.cli.common import signals_as_interrupt

    signals_as_interrupt()  # SIGTERM and SIGHUP stop a pull as Ctrl-C does: what is verified is kept, exit 130
    targets, fits = resolve_targets(refs, list(set_))
    if not targets:
        err_console().print("nothing to pull: " + "; ".join(f["nothing"] for f in fits if f.get("nothing")), highlight=False)
        if as_json:
            print_json({"repos": [], "complete": True, "recipes": fits})
        return
    plan = plan_pull(targets, check_only=check)
    _render_plan(plan, fits)
    if dry_run:
        if as_json:
            print_json({**plan.to_dict(), "recipes": fits})
        else:
            _render_files(plan)
        return
    if not check:
        _refuse_when_it_cannot_fit(fits, ignore_fit)
        check_room(plan, command)
    progress = PullProgress(plan)
    try:
        result = run_pull(plan, progress=progress, workers=workers, command=command)
    except BaseException:
        progress.close()
        _render_interrupted(plan, command)
        raise
    progress.close()
    _render_result(result)
    if as_json:
        print_json({**result.to_dict(), "recipes": fits})
    if check:
        bad = [(r, f) for r, f in plan.files if f.state in ("damaged", "missing")]
        if bad:
            names = ", ".join(f"{r.ref}: {f.path} ({f.state})" for r, f in bad[:3])
            raise DataError(f"{len(bad)} file(s) of the local copy are not the hub's: {names}",
                            hint=f"`{command.replace(' --check', '')}` fetches them again (and only them)")


# ------------------------------------------------------------------------------ what to pull

def resolve_targets(refs: list[str], sets: list[str]) -> tuple[list[tuple[str, Any]], list[dict[str, Any]]]:
    """[(role, HubRef)] for the arguments, and per recipe its memory fit (or why nothing is pulled).
    A recipe wins over a hub id of the same spelling; --set applies to recipes only."""
    from sparkit.errors import RecipeError, UsageError
    from sparkit.hub.refs import parse_hub_ref
    from sparkit.recipes.load import resolve_ref

    targets: list[tuple[str, Any]] = []
    fits: list[dict[str, Any]] = []
    plain = []
    for text in refs:
        try:
            resolve_ref(text)
        except RecipeError as not_a_recipe:
            ref = parse_hub_ref(text)
            if ref is None:
                raise UsageError(f"{text!r} is neither a recipe nor a hub id (ORG/NAME[@REVISION])",
                                 hint=not_a_recipe.hint or "see `sparkit recipes list`") from None
            targets.append(("model", ref))
            plain.append(text)
            continue
        found, fit = recipe_targets(text, sets)
        targets += found
        fits.append(fit)
    if sets and plain and not fits:
        raise UsageError("--set applies to a recipe; " + ", ".join(plain) + " is a hub id")
    return targets, fits


def recipe_targets(recipe: str, sets: list[str]) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """A recipe's hub models ([(role, HubRef)]) and its memory fit on this host, computed from the
    checkpoint's safetensors headers (read from the hub by range requests when it is not here)."""
    from sparkit.host import detect_host
    from sparkit.hub.pull import plan_targets
    from sparkit.memory.fit import compute_fit, memory_basis
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    plan = compile_plan(load_recipe(recipe, sets))
    targets = plan_targets(plan)
    entry: dict[str, Any] = {"recipe": plan.recipe_name, "models": [p["ref"] for p in plan.model_pulls],
                             "plan_command": "sparkit plan " + shlex.join([recipe, *(a for s in sets for a in ("--set", s))])}
    if not targets:
        entry["nothing"] = f"{plan.recipe_name} serves {plan.model}, which is not a hub id"
        return targets, entry
    fit = compute_fit(plan, memory_basis(plan, detect_host()))
    entry.update(verdict=fit.verdict, summary=fit.summary, checkpoint=fit.checkpoint_note,
                 basis=fit.basis.source if fit.basis else None, weights_bytes=fit.weights_bytes)
    return targets, entry


def _refuse_when_it_cannot_fit(fits: list[dict[str, Any]], ignore_fit: bool) -> None:
    from sparkit.errors import PreflightError

    for fit in fits:
        if fit.get("verdict") == "does-not-fit" and not ignore_fit:
            raise PreflightError(f"{fit['recipe']}: the memory fit says it does not fit ({fit['summary']}; {fit['basis']}): "
                                 "nothing was downloaded",
                                 hint=f"`{fit['plan_command']}` shows every term; --ignore-fit downloads it anyway")


# ------------------------------------------------------------------------------ rendering

def _size(n: float) -> str:
    from sparkit.memory.units import size_text

    return size_text(n)


def _say(text: str) -> None:
    from rich.markup import escape

    err_console().print(escape(text), highlight=False, soft_wrap=True)


def _render_plan(plan, fits: list[dict[str, Any]]) -> None:
    where, free = plan.disk()
    for fit in fits:
        if fit.get("verdict"):
            _say(f"{fit['recipe']}: memory fit: {fit['summary']} ({fit['checkpoint']})")
    for repo in plan.repos:
        present = sum(f.size for f in repo.files if f.state in ("present", "done"))
        weights = f"weights: {repo.weights_rule}" if repo.weights_rule else ""
        _say(f"{repo.ref} ({repo.role}) -> commit {repo.commit[:12]}: {len(repo.files)} files, {_size(repo.bytes)}"
             f" ({weights}; {len(repo.skipped)} other file(s) of the repository skipped)")
        if present:
            _say(f"  {_size(present)} already here and verified")
        if repo.note:
            _say(f"  {repo.note}")
    if not plan.check_only and plan.to_fetch_bytes:
        _say(f"to fetch: {_size(plan.to_fetch_bytes)}; {_size(free)} free on {where}")


def _render_files(plan) -> None:
    """--dry-run: every file of each repository, what it is and whether it is here (stdout)."""
    lines = []
    for repo in plan.repos:
        lines.append(f"{repo.ref}@{repo.commit[:12]}  {repo.snapshot}")
        for f in repo.files:
            hashed = "sha256" if f.sha256 else "git oid"
            extra = f"  (partial download: {_size(f.resumed_from)})" if f.resumed_from else ""
            lines.append(f"  {f.state:8} {_size(f.size):>10}  {f.path}  [{hashed} {f.etag[:12]}]{extra}")
        for path, why in repo.skipped:
            lines.append(f"  {'skip':8} {'':>10}  {path}: {why}")
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()


def _render_result(result) -> None:
    plan = result.plan
    rate = result.fetched_bytes / result.seconds if result.seconds > 0 else 0
    for repo in plan.repos:
        state = "complete" if all(f.state in ("present", "done") for f in repo.files) else "incomplete"
        if plan.check_only:
            bad = [f for f in repo.files if f.state in ("damaged", "missing")]
            state = "verified" if not bad else f"{len(bad)} file(s) damaged or missing"
        _say(f"{repo.ref}: {state}: {repo.snapshot}")
        for f in repo.files:
            if f.state in ("damaged", "missing"):
                _say(f"  {f.state}: {f.path}: {f.note}")
    if not plan.check_only and result.fetched_bytes:
        again = f", {_size(result.refetched_bytes)} of it fetched again after a hash mismatch" if result.refetched_bytes else ""
        _say(f"fetched {_size(result.fetched_bytes)} in {result.seconds:.1f} s ({_size(rate)}/s){again}; "
             f"{result.verified_files} file(s) verified")
    elif not plan.check_only:
        _say("nothing to fetch: every file was here already" + (f" ({result.verified_files} verified again)"
                                                                 if result.verified_files else " and verified"))
    _say(f"page cache: {_size(result.page_cache_bytes)} of the {_size(plan.total_bytes)} is cached "
         "(each file's pages are dropped once it is verified)")


def _render_interrupted(plan, command: str) -> None:
    done = [f for _, f in plan.files if f.state in ("present", "done")]
    partial = [f for _, f in plan.files if f.state in ("fetching",) and f.done]
    try:
        _say(f"stopped: {len(done)} of {len(plan.files)} files verified and kept"
             + (f"; {partial[0].path} kept at {_size(partial[0].done)} of {_size(partial[0].size)}" if partial else "")
             + f"; `{command}` resumes")
    except (OSError, ValueError):
        pass


def _list(as_json: bool) -> None:
    from pathlib import Path

    from sparkit.hub.cache import pulled_models
    from sparkit.memory.pagecache import residency, weight_files

    rows = pulled_models()
    for row in rows:
        files = weight_files([Path(row["snapshot"])]) if row["present"] else []
        row["page_cache_bytes"], _ = residency(files)
    if as_json:
        print_json({"models": rows})
        return
    if not rows:
        _say("no models pulled yet; `sparkit pull RECIPE` pulls one")
        return
    for row in rows:
        state = "complete" if row["complete"] and row["present"] else ("gone" if not row["present"] else "incomplete")
        line = (f"{row['repo']}@{row['revision'] or 'main'}  {row['commit'][:12]}  {row['files']} files  "
                f"{_size(row['bytes'])}  {state}  page cache {_size(row['page_cache_bytes'])}  {row['snapshot']}")
        sys.stdout.write(line + "\n")
    sys.stdout.flush()


class PullProgress:
    """Progress of a pull on stderr: on a terminal one live line per file and a total with rate
    and time left; otherwise plain lines (a file started, resumed, verified; the total after each
    file and at every tenth of the bytes), which read the same however fast the machine is."""

    def __init__(self, plan) -> None:
        self.plan = plan
        self.live = is_terminal(sys.stderr)
        self.start = time.monotonic()
        self._ok = sum(1 for _, f in plan.files if f.state == "present")
        self._tenths = int(10 * plan.present_bytes / max(plan.total_bytes, 1))
        self._lock = threading.Lock()
        self.bar = None
        self.tasks: dict[int, Any] = {}
        if self.live:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                                TimeRemainingColumn(), console=err_console(), transient=False)
            self.total = self.bar.add_task("[bold]total[/]", total=max(plan.total_bytes, 1),
                                           completed=plan.present_bytes + sum(f.resumed_from for _, f in plan.files))
            interrupts.held(self.bar.start)  # a refresh thread starts: held (sparkit.interrupts)

    # the totals, from the plan's files
    def _totals(self) -> tuple[int, int, float, float | None]:
        have = sum(f.size if f.state in ("present", "done") else f.done for _, f in self.plan.files)
        fetched = sum(f.fetched for _, f in self.plan.files)
        elapsed = time.monotonic() - self.start
        rate = fetched / elapsed if elapsed > 0 else 0.0
        left = (self.plan.total_bytes - have) / rate if rate > 0 else None
        return have, fetched, rate, left

    def __call__(self, event: str, repo, f) -> None:
        with self._lock:
            if event == "stopping":
                self.close()
                self._line("stopping: the files being fetched stop at their next chunk (their partial downloads are kept)")
                return
            if self.live:
                self._live(event, repo, f)
            else:
                self._plain(event, repo, f)

    def _live(self, event: str, repo, f) -> None:
        if f is not None:
            key = id(f)
            if key not in self.tasks and event in ("fetching", "verifying"):
                self.tasks[key] = self.bar.add_task(f.path, total=max(f.size, 1), completed=f.done)
            task = self.tasks.get(key)
            if task is not None:
                label = {"verifying": f"{f.path} [dim](verifying)[/]", "done": f"{f.path} [green]sha256 ok[/]" if f.lfs
                         else f"{f.path} [green]ok[/]", "verified": f"{f.path} [green]verified[/]",
                         "mismatch": f"{f.path} [yellow](hash mismatch: again)[/]", "failed": f"{f.path} [red]failed[/]",
                         "dropped": f"{f.path} [yellow](connection dropped: resumed)[/]"}.get(event)
                self.bar.update(task, completed=f.done, **({"description": label} if label else {}))
        have, _, _, _ = self._totals()
        self.bar.update(self.total, completed=have)

    def _plain(self, event: str, repo, f) -> None:
        if event == "fetching":
            resumed = f" (resuming at {_size(f.done)})" if f.done else ""
            self._line(f"fetch   {repo.ref}: {f.path}  {_size(f.size)}{resumed}")
        elif event == "verifying":
            self._line(f"verify  {repo.ref}: {f.path}  {_size(f.size)}")
        elif event == "dropped":
            self._line(f"resume  {repo.ref}: {f.path}: the connection dropped at {_size(f.done)}; continuing from there")
        elif event == "mismatch":
            self._line(f"again   {repo.ref}: {f.path}: {f.note}; fetching it again from its first byte")
        elif event == "failed":
            self._line(f"failed  {repo.ref}: {f.path}: {f.note}")
        elif event in ("done", "verified"):
            how = "sha256" if f.lfs else "git oid"
            self._ok += 1
            self._line(f"ok      {repo.ref}: {f.path}  {_size(f.size)}  {how} matches the hub's  "
                       f"({self._ok}/{len(self.plan.files)})")
            if not self.plan.check_only:
                self._tenth()
        elif event == "bytes" and not self.plan.check_only:
            self._tenth()
        elif event == "linked":
            self._line(f"linked  {repo.ref}: {repo.snapshot}")

    def _tenth(self) -> None:
        """The total, each time it crosses another tenth of the bytes (and at the end)."""
        have, _, _, _ = self._totals()
        tenths = int(10 * have / max(self.plan.total_bytes, 1))
        if tenths > self._tenths:
            self._tenths = tenths
            self._total_line()

    def _total_line(self) -> None:
        have, _, rate, left = self._totals()
        when = f", {_duration(left)} left" if left is not None and have < self.plan.total_bytes else ""
        pct = 100 * have / max(self.plan.total_bytes, 1)
        self._line(f"total   {_size(have)} of {_size(self.plan.total_bytes)} ({pct:.0f}%), {_size(rate)}/s{when}")

    def _line(self, text: str) -> None:
        try:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        if self.bar is not None:
            try:
                self.bar.stop()
            except Exception:
                pass
            self.bar = None
            self.live = False


def _duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def pull_for_plan(plan, *, workers: int = 4) -> None:
    """What `sparkit up --pull` runs before the launch: the plan's missing hub models, with the
    same progress as `sparkit pull` (room checked first)."""
    from sparkit.hub.pull import check_room, plan_pull, plan_targets, run_pull

    missing = plan_targets(plan, missing_only=True)
    command = "sparkit pull " + " ".join(str(ref) for _, ref in missing)
    pulled = plan_pull(missing)
    _render_plan(pulled, [])
    check_room(pulled, command)
    progress = PullProgress(pulled)
    try:
        result = run_pull(pulled, progress=progress, workers=workers, command=command)
    except BaseException:
        progress.close()
        _render_interrupted(pulled, command)
        raise
    progress.close()
    _render_result(result)
