"""The acceptance profile: where speculative decoding pays, by kind of text and context depth.

Speculative decoding's gain depends on the text: the draft is right more often on code and
repetitive text than on prose (the Spark study's accept length fell from 3.90 on synthetic
prompts to 2.68 on GSM8K, its gain from +185% to +42.5%). The profile runs one recipe twice,
with its speculative decoding and with `stack.speculative=none`, over texts of several kinds
(shipped in sparkit/bench/texts, sources and licences in NOTICE.txt) cut to several depths, and
reports per cell the accept length, both decode speeds and the net speed-up, then a verdict per
kind ("MTP pays on math +38%", "loses on prose -4%").

Both servers are up at once and each prompt goes to one then the other (the order alternating),
so load drifting on a shared machine hits both alike; `sequential` runs one server after the
other instead (what a 60 GB model on one Spark needs). The speed-up of a cell is the median over
its prompts of TPOT(off) / TPOT(on), paired prompt by prompt; its noise is twice the standard
error of the log ratios. A verdict pools a kind's prompts over all depths. Greedy, ignore_eos.
Next to each cell, the roofline's expected speed-up at the cell's accept length and context:
accept x (plain step bytes) / (cycle bytes).
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkit.bench.profile_texts import KINDS, passages, profile_prompts
from sparkit.errors import DataError, UsageError

PROFILE_KIND = "sparkit-profile"
NOISE_SIGMAS = 2.0


@dataclass
class ProfileConfig:
    kinds: list[str] = field(default_factory=lambda: list(KINDS))
    depths: list[int] = field(default_factory=lambda: [256, 2048])
    prompts_per_cell: int = 4
    output_len: int = 128
    warmup: int = 1
    seed: int = 0
    sequential: bool = False


def default_shape(recipe: Any) -> tuple[list[int], int, str | None]:
    """(depths, output tokens, why) suited to the model: within the context it was made for
    (sparkit.bench.workload.model_context; tiny-ling knows 128-token windows), else 256 and 2048."""
    from sparkit.bench.workload import model_context

    context = model_context(recipe)
    if context is None or context.tokens >= 2048 + 128:
        return [256, 2048], 128, None
    c = context.tokens
    depths, out = [c // 4, 3 * c // 4], c // 4
    return depths, out, f"{context.why}: depths {depths[0]} and {depths[1]}, {out} output tokens"


# ---------------------------------------------------------------- statistics


def paired_speedup(tpot_on: list[float], tpot_off: list[float]) -> tuple[float | None, float | None]:
    """(median of TPOT_off / TPOT_on, noise as a relative half-width: exp(2 x standard error of the
    log ratios) - 1), over the prompts both sides finished."""
    ratios = [off / on for on, off in zip(tpot_on, tpot_off) if on and off and on > 0 and off > 0]
    if not ratios:
        return None, None
    median = statistics.median(ratios)
    if len(ratios) < 2:
        return median, None
    logs = [math.log(r) for r in ratios]
    se = statistics.stdev(logs) / math.sqrt(len(logs))
    return median, math.exp(NOISE_SIGMAS * se) - 1


def verdict(kind: str, speedup: float | None, noise: float | None, accept: float | None) -> tuple[str, str]:
    """(pays | loses | even | unknown, the sentence)."""
    if speedup is None:
        return "unknown", f"no finished prompts of {kind}"
    gain = speedup - 1
    details = ", ".join(([f"accept {accept:.2f}"] if accept else [])
                        + [f"noise ±{noise:.0%}" if noise is not None else "noise unknown"])
    if noise is not None and abs(math.log(speedup)) <= math.log1p(noise):
        return "even", f"no measurable difference on {kind} ({gain:+.0%}; {details})"
    word = "pays" if gain > 0 else "loses"
    return word, f"MTP {word} on {kind} {gain:+.0%} ({details})"


# ---------------------------------------------------------------- the run


@dataclass
class Side:
    label: str  # "on" | "off"
    url: str
    api_key: str | None = None
    recipe: dict[str, Any] | None = None
    run_id: str | None = None


ProgressFn = Callable[[str, int, int], None]


async def run_cells(on: Side, off: Side, config: ProfileConfig, *, on_progress: ProgressFn | None = None,
                    only: str | None = None, prompts: dict | None = None) -> dict[tuple[str, int], dict[str, list]]:
    """Timelines per (kind, depth) and side. `only` ("on"/"off") runs one side (sequential mode)."""
    from sparkit.bench.runner import _one_request
    from sparkit.bench.workload import tokenizer_from_server
    from sparkit.client import EngineClient

    progress = on_progress or (lambda phase, done, total: None)
    sides = [on, off] if only is None else [on if only == "on" else off]
    async with EngineClient(sides[0].url, api_key=sides[0].api_key) as first:
        model_info = await _model_info(first)
        tokenizer = tokenizer_from_server(model_info, await first.server_info())
    if prompts is None:
        prompts = {(k, d): profile_prompts(k, d, config.prompts_per_cell, tokenizer=tokenizer, seed=config.seed)
                   for k in config.kinds for d in config.depths}
    sampling = {"temperature": 0.0, "max_new_tokens": config.output_len, "ignore_eos": True}
    results: dict[tuple[str, int], dict[str, list]] = {key: {s.label: [] for s in sides} for key in prompts}
    from contextlib import AsyncExitStack

    async with AsyncExitStack() as stack:
        clients = {s.label: await stack.enter_async_context(EngineClient(s.url, api_key=s.api_key)) for s in sides}
        warm = profile_prompts(config.kinds[0], min(config.depths), 1, tokenizer=tokenizer, seed=config.seed + 7919)[0]
        for _ in range(config.warmup):
            for s in sides:
                await _one_request(clients[s.label], warm, sampling)
        total = sum(len(p) for p in prompts.values()) * len(sides)
        done = 0
        progress("profile", 0, total)
        turn = 0
        for key, cell_prompts in prompts.items():
            for prompt in cell_prompts:
                order = sides if turn % 2 == 0 else list(reversed(sides))
                turn += 1
                for s in order:
                    results[key][s.label].append(await _one_request(clients[s.label], prompt, sampling))
                    done += 1
                    progress("profile", done, total)
    results["__prompts__"] = prompts  # type: ignore[index]
    return results


async def _model_info(client: Any) -> dict[str, Any]:
    from sparkit.errors import EngineError

    try:
        return await client.model_info()
    except EngineError:
        return {}


def summarise_cells(results: dict, config: ProfileConfig, recipe: Any | None) -> tuple[list[dict], list[dict]]:
    """Cells (kind x depth) and verdicts (per kind) from the timelines of both sides."""
    from sparkit.bench.metrics import mean

    prompts = results["__prompts__"]
    cells: list[dict] = []
    pooled: dict[str, dict[str, list]] = {}
    rooflines: dict[int, Any] = {}
    for (kind, depth), sides in ((k, v) for k, v in results.items() if k != "__prompts__"):
        on, off = sides["on"], sides["off"]
        pairs = [(a, b) for a, b in zip(on, off) if a.ok and b.ok and a.tpot and b.tpot]
        tpot_on = [a.tpot * 1000 for a, _ in pairs]
        tpot_off = [b.tpot * 1000 for _, b in pairs]
        accepts = [a.accept_length for a, _ in pairs if a.accept_length]
        speedup, noise = paired_speedup(tpot_on, tpot_off)
        accept = mean(accepts) if accepts else None
        context = depth + config.output_len // 2
        model = expected_speedup(recipe, context, accept, rooflines)
        cells.append({
            "kind": kind, "depth": depth, "prompts": len(pairs), "failed": len(on) + len(off) - 2 * len(pairs),
            "accept_length": accept,
            "tok_s_on": 1000 / mean(tpot_on) if tpot_on else None,
            "tok_s_off": 1000 / mean(tpot_off) if tpot_off else None,
            "speedup": speedup, "noise": noise, "model_speedup": model,
            "wrapped": any(p.wrapped for p in prompts[(kind, depth)]),
            "errors": sorted({t.error for t in on + off if t.error})[:3],
        })
        bucket = pooled.setdefault(kind, {"on": [], "off": [], "accept": []})
        bucket["on"] += tpot_on
        bucket["off"] += tpot_off
        bucket["accept"] += accepts
    verdicts = []
    for kind in config.kinds:
        bucket = pooled.get(kind, {"on": [], "off": [], "accept": []})
        speedup, noise = paired_speedup(bucket["on"], bucket["off"])
        accept = mean(bucket["accept"]) if bucket["accept"] else None
        word, sentence = verdict(kind, speedup, noise, accept)
        verdicts.append({"kind": kind, "verdict": word, "sentence": sentence, "speedup": speedup, "noise": noise,
                         "accept_length": accept, "prompts": len(bucket["on"])})
    return cells, verdicts


def expected_speedup(recipe: Any | None, context: int, accept: float | None, cache: dict[int, Any]) -> float | None:
    """The roofline's speed-up of speculative over plain decoding at `accept` (bytes only: the
    bandwidth cancels)."""
    if recipe is None or accept is None:
        return None
    if context not in cache:
        from sparkit.roofline.bandwidth import Bandwidth
        from sparkit.roofline.estimate import NoLayout, estimate

        try:
            cache[context] = estimate(recipe, context=context, bandwidth=Bandwidth(None, 1, "unknown", "ratio only"))
        except (NoLayout, DataError, ValueError, KeyError):
            cache[context] = None
    roof = cache[context]
    if roof is None or roof.spec is None:
        return None
    return accept * roof.step_bytes / roof.spec.cycle_bytes(accept)


def run_profile(recipe_ref: str, config: ProfileConfig, *, overrides: list[str] | None = None,
                out_path: Path | None = None, on_progress: ProgressFn | None = None,
                launch_timeout: float = 600) -> dict[str, Any]:
    """Bring up the recipe with and without its speculative decoding, profile both, stop both."""
    import asyncio
    import contextlib
    import json

    from sparkit import runs
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    overrides = list(overrides or [])
    loaded_on = load_recipe(recipe_ref, overrides)
    if not loaded_on.recipe.stack.speculative.enabled:
        raise UsageError(f"{loaded_on.name} has no speculative decoding: the profile compares it on and off",
                         hint="profile a recipe with stack.speculative set (e.g. tiny), or --set stack.speculative=nextn")
    loaded_off = load_recipe(recipe_ref, overrides + ["stack.speculative=none"])
    for kind in config.kinds:
        passages(kind)  # an unknown kind is a usage error before anything starts
    doc: dict[str, Any] = {
        "kind": PROFILE_KIND, "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "recipe": loaded_on.name, "overrides": overrides, "config": asdict(config),
        "speculative": loaded_on.recipe.stack.speculative.model_dump(), "cells": [], "verdicts": [],
        "servers": {}, "complete": False,
    }
    def start(label: str, loaded: Any, servers: contextlib.ExitStack) -> Side:
        """A transient server for one side (stopped when `servers` closes, Ctrl-C included)."""
        plan = compile_plan(loaded, port=runs.free_port())
        if on_progress:
            on_progress(f"start {label}", 0, 1)
        started = servers.enter_context(runs.transient_server(plan, timeout=launch_timeout))
        if on_progress:
            on_progress(f"start {label}", 1, 1)
        server = started.server
        doc["servers"][label] = {"run_id": started.run.id, "url": server.url}
        return Side(label, server.url, server.api_key, plan.recipe, started.run.id)

    if config.sequential:
        results: dict = {}
        prompts = None
        for label, loaded in (("on", loaded_on), ("off", loaded_off)):
            with contextlib.ExitStack() as servers:
                side = start(label, loaded, servers)
                part = asyncio.run(run_cells(side, side, config, on_progress=on_progress, only=label, prompts=prompts))
            prompts = part.pop("__prompts__")
            for key, sides in part.items():
                results.setdefault(key, {}).update(sides)
        results["__prompts__"] = prompts
    else:
        with contextlib.ExitStack() as servers:
            on, off = start("on", loaded_on, servers), start("off", loaded_off, servers)
            results = asyncio.run(run_cells(on, off, config, on_progress=on_progress))
    doc["cells"], doc["verdicts"] = summarise_cells(results, config, loaded_on.recipe)
    doc["complete"] = True
    if out_path is not None:
        from sparkit.paths import ensure_dir, write_atomic

        ensure_dir(out_path.parent)
        write_atomic(out_path, json.dumps(doc, indent=1, default=str))
    return doc


__all__ = ["KINDS", "passages", "profile_prompts", "ProfileConfig", "run_profile", "paired_speedup", "verdict",
           "default_shape", "summarise_cells"]
