"""`sparkit model make-tiny` and `sparkit model export-hf`: build tiny-ling, write it as a Hugging
Face checkpoint (parse, call the builder, render)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

model_app = typer.Typer(help="Built-in models: build tiny-ling, the embedded engine's model.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")


@model_app.command("make-tiny")
def make_tiny(
    directory: Path | None = typer.Argument(None, help="Where to build it (default: sparkit's cache, models/tiny-ling-s{SEED})."),
    seed: int = typer.Option(0, "--seed", help="Initialisation and corpus seed (a different seed gives a different model)."),
    steps: int | None = typer.Option(None, "--steps", min=1, help="Optimiser steps (default: the shipped build's; fewer skip the quality gate)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout (progress and messages on stderr)."),
) -> None:
    """Train tiny-ling (a miniature Ling MoE with an MTP layer) on CPU and save it; reuses a complete build.

    The build depends on the seed and the steps only (not on how busy the machine is). The
    default build ships with sparkit, so without DIRECTORY this returns at once."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from sparkit.cli.common import console, err_console, print_json
    from sparkit.engines.embedded.builder import ensure_model
    from sparkit.engines.embedded.checkpoint import MARKER

    with Progress(
        TextColumn("[bold]tiny-ling[/]"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
        TextColumn("{task.description}"), console=err_console(), transient=as_json,
    ) as bar:
        task = bar.add_task("starting", total=1.0)

        def progress(fraction: float, message: str) -> None:
            bar.update(task, completed=fraction, description=message)

        path = ensure_model("tiny-ling", seed=seed, directory=directory, progress=progress, steps=steps)
    build = json.loads((path / MARKER).read_text())
    result = {"path": str(path), **build}
    if as_json:
        print_json(result)
        return
    console().print(f"tiny-ling ready at [bold]{path}[/]")
    details = ", ".join(f"{k} {build[k]}" for k in ("parameters", "train_steps", "final_loss", "final_mtp_loss") if k in build)
    quality = build.get("quality") or {}
    if quality:
        details += f", held-out loss {quality['heldout_loss']}, NEXTN accept length {quality['accept_length']}"
    if details:
        console().print(details, highlight=False)


@model_app.command("export-hf")
def export_hf_cmd(
    directory: Path | None = typer.Argument(None, help="Where to write it (default: sparkit's cache, models/tiny-ling-s{SEED}-hf-{DTYPE}, "
                                                "or -hf-{WEIGHTS} for a quantised layout)."),
    source: Path | None = typer.Option(None, "--from", help="A tiny-ling checkpoint directory (default: the built-in build of --seed)."),
    seed: int = typer.Option(0, "--seed", help="Which built-in build to export (without --from)."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="Dtype of the unquantised tensors: bfloat16 or float32."),
    weights: str = typer.Option("bf16", "--weights", help="Linear weights layout: bf16; fp8 (block-128 FP8, Ling's -fp8); "
                                "mxfp4 (MXFP4 routed experts, FP8 elsewhere, Ling's -fp4)."),
    damage_scale: bool = typer.Option(False, "--debug-damage-scale", help="DEBUG: write one expert's scale wrong "
                                      "(x64), so that the known-answer check has something to catch."),
    as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout (progress and messages on stderr)."),
) -> None:
    """Write tiny-ling as a Hugging Face BailingMoeV2 checkpoint that stock SGLang serves with its own
    model code (`--trust-remote-code`), NextN layer and tokenizer included; with --weights fp8 or
    mxfp4 in the layout of the published Ling -fp8 / -fp4 checkpoints, with the
    quantization_config SGLang reads. The embedded engine loads every export too. An export that
    is already complete (same build, dtype and layout) is reused."""
    from sparkit.cli.common import console, err_console, print_json
    from sparkit.engines.embedded import checkpoint, hf_checkpoint
    from sparkit.engines.embedded.builder import ensure_model

    if source is None:
        source = ensure_model("tiny-ling", seed=seed)
    destination = directory or checkpoint.hf_export_dir(source, dtype, weights, damage_scale)
    err_console().print(f"exporting {source} ({weights}) ...", highlight=False)
    checkpoint.ensure_hf_export(source, destination, dtype, weights, damage_scale)
    marker = json.loads((destination / hf_checkpoint.EXPORT_MARKER).read_text())
    result = {"path": str(destination), **marker}
    if as_json:
        print_json(result)
        return
    layout = "" if weights == "bf16" else f", {marker['layout']}"
    console().print(f"exported {source} -> [bold]{destination}[/] ({hf_checkpoint.HF_ARCHITECTURE}, {dtype}{layout}, "
                    f"{marker['tensors']} tensors)", highlight=False)
    if marker.get("damaged_scale"):
        console().print(f"[yellow]deliberately damaged:[/] {marker['damaged_scale']['tensor']} "
                        f"x{marker['damaged_scale']['factor']}", highlight=False)
    console().print(f"serve it: python -m sglang.launch_server --model-path {destination} --trust-remote-code", highlight=False)
