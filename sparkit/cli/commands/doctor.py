"""`sparkit doctor`: this host (GPUs, the memory picture), the engines and whether the installed
packages agree, which shipped targets run here, and the memory bandwidth plans use."""

from __future__ import annotations

from pathlib import Path

import typer

from sparkit.cli import options
from sparkit.cli.common import console, err_console, print_json


def doctor_cmd(
    as_json: options.Json = False,
    bandwidth: bool = typer.Option(False, "--bandwidth", help="Measure this host's memory bandwidth (CPU; each GPU through torch) and store it for plans and benches."),
    bandwidth_mib: int | None = typer.Option(None, "--bandwidth-mib", metavar="MIB", min=16, help="Buffer size of the measurement in MiB (default 256 on CPU, 1024 on a GPU)."),
) -> None:
    from sparkit.engines.base import registry
    from sparkit.host import detect_host, target_fit
    from sparkit.memory.picture import memory_picture

    host = detect_host()
    picture = memory_picture(host, _shipped_checkpoint_dirs())
    engines = [adapter.probe() for adapter in registry().values()]
    targets = []
    for name, engine, recipes in _shipped_targets():
        ok, why = target_fit(host, name, engine)
        targets.append({"target": name, "engine": engine, "ok": ok, "why": why, "recipes": recipes})
    measured_now = _measure_bandwidth(host, bandwidth_mib) if bandwidth else None
    memory = _bandwidth_report(host, measured_now)
    compatibility = _compatibility()
    if as_json:
        print_json({"host": host.to_dict(), "memory": picture.to_dict(), "engines": [e.__dict__ for e in engines],
                    "targets": targets, "bandwidth": memory, "compatibility": compatibility})
        return
    render_doctor(host, engines, targets, picture)
    render_compatibility(compatibility)
    render_bandwidth(memory)


def _compatibility() -> dict:
    """Each engine's judgement of its installed packages (an adapter's optional `compatibility`),
    for the shipped recipes of that engine."""
    from sparkit.engines.base import registry
    from sparkit.errors import SparkitError
    from sparkit.recipes.load import load_recipe, shipped_recipes

    by_engine: dict[str, list] = {}
    for name, path in shipped_recipes():
        try:
            loaded = load_recipe(path)
        except SparkitError:
            continue
        by_engine.setdefault(loaded.recipe.engine, []).append((name, loaded.recipe.model_dump(mode="json")))
    out = {}
    for engine, adapter in registry().items():
        judge = getattr(adapter, "compatibility", None)
        if judge is None or not by_engine.get(engine):
            continue
        err_console().print(f"judging the installed {engine} stack from its source...", highlight=False)
        out[engine] = judge(by_engine[engine])
    return out


_COMPAT_STYLE = {"ok": "green", "plugin": "cyan", "warn": "yellow", "fail": "bold red", "unknown": "dim"}


def render_compatibility(compatibility: dict) -> None:
    """Per engine: the installed versions, every pair with its verdict, evidence and fix, then
    which shipped recipes the installed stack can run."""
    from rich.markup import escape

    out = console()
    for engine, doc in compatibility.items():
        installed = ", ".join(f"{dist} {info['version'] or 'not installed'}" for dist, info in doc["installed"].items())
        out.print(f"\n[bold]compatibility[/] ({engine}, judged from the installed code)", highlight=False)
        out.print(f"  installed: {escape(installed)}", highlight=False, soft_wrap=True)
        for f in doc["findings"]:
            style = _COMPAT_STYLE.get(f["status"], "")
            out.print(f"  [{style}]{f['status']:7}[/] {escape(f['pair'])}  [dim]{escape(f['feature'])}[/]",
                      highlight=False, soft_wrap=True)
            if f["status"] == "ok":
                continue
            out.print(f"          {escape(f['detail'])}", highlight=False, soft_wrap=True)
            for line in f["evidence"][:3]:
                out.print(f"          [dim]{escape(line)}[/]", highlight=False, soft_wrap=True)
            if f["fix"]:
                out.print(f"          fix ({f['fix_kind']}): {escape(f['fix'])}", highlight=False, soft_wrap=True)
        out.print("  shipped recipes:", highlight=False)
        for r in doc["recipes"]:
            if r["runs"]:
                note = f" (with the plugin's fix: {', '.join(r['plugin'])})" if r["plugin"] else ""
                out.print(f"    [green]runs[/]  {escape(r['recipe'])}{escape(note)}", highlight=False, soft_wrap=True)
            else:
                out.print(f"    [red]fails[/] {escape(r['recipe'])}: {escape('; '.join(r['failed']))}", highlight=False,
                          soft_wrap=True)


def _measure_bandwidth(host, mib: int | None) -> dict:
    """Measure the CPU and every GPU torch can reach; keep each figure unless a better one of the
    same device is stored. Progress and a busy machine's warning on stderr."""
    from sparkit.errors import UsageError
    from sparkit.roofline.bandwidth import keep_best, measure_cpu, measure_gpu

    size = mib * (1 << 20) if mib else None
    if size and size * 2 > host.ram_available_bytes > 0:
        raise UsageError(f"--bandwidth-mib {mib}: two buffers of {mib} MiB do not fit the "
                         f"{host.ram_available_bytes >> 20} MiB of memory available", hint="choose a smaller size")
    done, kept, skipped = [], [], []
    err_console().print("measuring the CPU's memory bandwidth (1 thread, 5 rounds, the best kept)...", highlight=False)
    cpu = measure_cpu(size)
    _warn_if_busy(cpu)
    stored, path = keep_best(cpu)
    done.append(cpu)
    kept.append(stored)
    if host.gpus:
        try:
            import torch

            cuda = torch.cuda.is_available()
        except ImportError:
            cuda = False
        if not cuda:
            skipped.append("GPUs: torch with CUDA is not installed here, so they were not measured")
        else:
            for index in range(torch.cuda.device_count()):
                err_console().print(f"measuring GPU{index}'s memory bandwidth (5 rounds, the best kept)...", highlight=False)
                try:
                    gpu = measure_gpu(index, size)
                except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:  # a busy or small GPU
                    skipped.append(f"GPU{index}: not measured ({str(exc).splitlines()[0]})")
                    continue
                _warn_if_busy(gpu)
                done.append(gpu)
                kept.append(keep_best(gpu)[0])
    return {"measurements": done, "kept": kept, "skipped": skipped, "stored_in": str(path)}


def _warn_if_busy(m) -> None:
    if m.busy:
        err_console().print(
            f"[yellow]warning:[/] the machine was busy while measuring {m.device}: other processes used "
            f"{m.others_cpu_cores:.1f} of {m.cpu_count} cores (load average {m.load_avg_1m}); memory bandwidth "
            "is shared, so the figure is likely low: measure again when the machine is idle", highlight=False)


def _bandwidth_report(host, measured_now: dict | None) -> dict:
    """What plans will use: this host's stored measurements and its GPUs' spec sheets."""
    from dataclasses import asdict

    from sparkit.roofline.bandwidth import gpu_spec, load_measurements, store_path, this_host

    stored = [{**asdict(m), "busy": m.busy, "conditions": m.conditions()}
              for m in load_measurements() if m.host == this_host()]
    specs = []
    for g in host.gpus:
        spec = gpu_spec(g.name)
        specs.append({"gpu": g.index, "name": g.name, "spec_gb_s": spec[1] if spec else None,
                      "spec_name": spec[0] if spec else None})
    report = {"stored": stored, "stored_in": str(store_path()), "gpu_specs": specs, "measured_now": None,
              "skipped": []}
    if measured_now is not None:
        report["measured_now"] = [{**asdict(m), "busy": m.busy, "conditions": m.conditions(),
                                   "kept": asdict(k) == asdict(m)}
                                  for m, k in zip(measured_now["measurements"], measured_now["kept"])]
        report["skipped"] = measured_now["skipped"]
    return report


def render_bandwidth(memory: dict) -> None:
    from rich.markup import escape

    out = console()
    out.print("\n[bold]memory bandwidth[/]")
    for spec in memory["gpu_specs"]:
        figure = f"{spec['spec_gb_s']:.0f} GB/s ({spec['spec_name']} spec sheet)" if spec["spec_gb_s"] else "no spec sheet known"
        out.print(f"  GPU{spec['gpu']}: {escape(figure)}", highlight=False)
    now = {m["device"]: m for m in memory["measured_now"] or []}
    if memory["stored"]:
        for m in memory["stored"]:
            threads = f"{m['threads']} thread" + ("s" if (m["threads"] or 0) > 1 else "") + ", " if m["threads"] else ""
            out.print(f"  {escape(m['device'])}: read {m['read_gb_s']:.1f} GB/s, copy {m['copy_gb_s']:.1f} GB/s "
                      f"({threads}{m['buffer_bytes'] >> 20} MiB; {escape(m['conditions'])})", highlight=False)
            new = now.get(m["device"])
            if new is not None and not new["kept"]:
                out.print(f"    this measurement reached {new['read_gb_s']:.1f} GB/s read ({escape(new['conditions'])}): "
                          "the better figure above is kept", highlight=False)
        out.print(f"  stored in {escape(memory['stored_in'])}: plans and benches on this host use the read figure",
                  highlight=False)
    else:
        out.print("  not measured on this host: `sparkit doctor --bandwidth` measures it for plans and benches",
                  highlight=False)
    for note in memory["skipped"]:
        err_console().print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)


def _shipped_checkpoint_dirs() -> list:
    """The checkpoints of the shipped recipes that are on this machine, and every model `sparkit
    pull` fetched (their page-cache share is part of the memory picture)."""
    from sparkit.engines.builtin_models import parse_builtin
    from sparkit.errors import SparkitError
    from sparkit.memory.checkpoint_location import locate
    from sparkit.recipes.load import load_recipe, shipped_recipes

    dirs: dict = {}
    for _name, path in shipped_recipes():
        try:
            r = load_recipe(path).recipe
        except SparkitError:
            continue
        for ref in filter(None, (r.model.path, r.stack.speculative.draft_model)):
            build = None
            parsed = parse_builtin(ref)
            if parsed:
                from sparkit.engines.builtin_models import builtin_build_dir

                build = builtin_build_dir(*parsed)
            location = locate(ref, build)
            if location.directory is not None:
                dirs.setdefault(location.directory.resolve(), None)
    from sparkit.hub.cache import pulled_models

    for pulled in pulled_models():  # what `sparkit pull` fetched, whichever recipe serves it
        if pulled["present"]:
            dirs.setdefault(Path(pulled["snapshot"]).resolve(), None)
    return list(dirs)


def _shipped_targets() -> list[tuple[str, str, list[str]]]:
    """(target, engine, shipped recipe names) for every (target, engine) pair shipped."""
    from sparkit.errors import SparkitError
    from sparkit.recipes.load import load_recipe, shipped_recipes

    groups: dict[tuple[str, str], list[str]] = {}
    for name, path in shipped_recipes():
        try:
            r = load_recipe(path).recipe
        except SparkitError:
            continue
        groups.setdefault((r.target, r.engine), []).append(name)
    return [(t, e, names) for (t, e), names in groups.items()]


def render_doctor(host, engines, targets, picture=None) -> None:
    from rich.markup import escape

    out = console()
    gib = 1024**3
    out.print("[bold]host[/]")
    out.print(f"  {host.os} {host.machine}, {host.cpu_cores} cores, RAM {host.ram_total_bytes / gib:.1f} GiB "
              f"({host.ram_available_bytes / gib:.1f} GiB available)", highlight=False)
    if host.gpus:
        out.print(f"  driver {host.driver_version or '?'}, CUDA {host.cuda_version or '?'}", highlight=False)
        for g in host.gpus:
            mem = (f"{g.memory_total_bytes / gib:.1f} GiB" if g.memory_total_bytes
                   else f"{g.memory_note} (host RAM {host.ram_total_bytes / gib:.1f} GiB)" if g.unified_memory
                   else g.memory_note or "unknown")
            out.print(f"  GPU{g.index}: {escape(g.name)}, {g.sm or '?'}, memory {escape(mem)}", highlight=False)
        for link in host.gpu_links:
            out.print(f"  {escape(link)}", highlight=False)
    else:
        out.print(f"  no NVIDIA GPU: {escape(host.nvml_status)}", highlight=False)
    if picture is not None:
        render_picture(picture)
    out.print("\n[bold]engines[/]")
    for e in engines:
        state = f"[green]{escape(e.version or 'installed')}[/]" if e.importable else "[red]not installed[/]"
        extras = ", ".join(f"{k} {v or 'missing'}" for k, v in e.extras.items())
        out.print(f"  {e.name}: {state}  [dim]{escape(extras)}[/]", highlight=False)
        if e.detail:
            out.print(f"    {escape(e.detail)}", highlight=False)
    _render_targets(out, targets)


def _render_targets(out, targets) -> None:
    """Which shipped targets run here: a line per (target, engine), its recipes indented below.
    Lines, not a table: a recipe name is never cut to fit a column (at 80 columns or piped)."""
    from rich.markup import escape
    from rich.padding import Padding

    def line(text: str, indent: int) -> None:
        if out.soft_wrap:  # piped: one line, never cut
            out.print(" " * indent + text, highlight=False)
        else:  # a terminal: wrapped at its width, wrapped lines indented as the first
            out.print(Padding(text, (0, 0, 0, indent)), highlight=False)

    out.print("\n[bold]shipped targets: which this host can run[/]")
    for t in sorted(targets, key=lambda t: not t["ok"]):
        verdict = "[green]yes[/]" if t["ok"] else "[red]no[/]"
        line(f"{escape(t['target'])} on {escape(t['engine'])}: {verdict}, {escape(t['why'])}", 2)
        line(f"[dim]{escape(', '.join(t['recipes']))}[/]", 4)


def render_picture(picture) -> None:
    """The memory picture, figures side by side, then why they differ."""
    from rich.markup import escape

    from sparkit.memory.units import gib

    out = console()
    m = picture.meminfo
    out.print("\n[bold]memory[/]" + (" (unified: the GPU shares it)" if picture.unified else ""))
    rows: list[tuple] = [("the OS can give now (MemAvailable)", m["available"]),
                         ("free, page cache excluded (MemFree)", m["free"]), ("page cache (reclaimable)", m["page_cache"])]
    rows += [("  of it, a model's files", c.cached_bytes, c.directory) for c in picture.checkpoints if c.cached_bytes]
    if picture.cuda_free_bytes is not None:
        rows.append(("CUDA would report free (~MemFree)", picture.cuda_free_bytes))
    rows.append(("swap used / total", None))
    width = max(len(row[0]) for row in rows)
    for label, value, *where in rows:
        text = (f"{gib(m['swap_used'])} / {gib(m['swap_total'])}" if value is None else gib(value))
        suffix = f"  [dim]{escape(where[0])}[/]" if where else ""
        out.print(f"  {escape(label).ljust(width)}  {text}{suffix}", highlight=False, soft_wrap=True)
    out.print(f"  {'NVML'.ljust(width)}  {escape(picture.nvml)}", highlight=False, soft_wrap=True)
    for reason in picture.reasons:
        out.print(f"  [dim]· {escape(reason)}[/]", highlight=False, soft_wrap=True)
