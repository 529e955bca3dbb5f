"""`sparkit model make-tiny`, `export-hf`, `make-dspark`, `export-dspark`: build a built-in model
(tiny-ling, tiny-ling-v3) or tiny-ling's DSpark draft, write them as checkpoints SGLang loads
(parse, call the builder, render)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sparkit.cli import options
from sparkit.cli.command_tree import SparkitTyper

model_app = SparkitTyper(no_args_is_help=True)  # its summary: sparkit.cli.commands.COMMANDS


@model_app.command("make-tiny")
def make_tiny(
    directory: Path | None = typer.Argument(None, help="Where to build it (default: sparkit's cache, models/{MODEL}-s{SEED})."),
    model: options.BuiltinModel = "tiny-ling",
    seed: int = typer.Option(0, "--seed", help="Initialisation and corpus seed (a different seed gives a different model)."),
    steps: int | None = typer.Option(None, "--steps", min=1, help="Optimiser steps (default: the shipped build's; fewer skip the quality gate)."),
    as_json: options.Json = False,
) -> None:
    """Train a built-in model (a miniature Ling MoE with an MTP layer) on CPU and save it; reuses a complete build.

    The build depends on the seed and the steps only (not on how busy the machine is). The
    default build ships with sparkit, so without DIRECTORY this returns at once."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from sparkit.cli.common import console, err_console, print_json
    from sparkit.engines.embedded.quality import measure_quality
    from sparkit.models.builder import ensure_model
    from sparkit.models.checkpoint import MARKER

    with Progress(
        TextColumn(f"[bold]{model}[/]"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
        TextColumn("{task.description}"), console=err_console(), transient=as_json,
    ) as bar:
        task = bar.add_task("starting", total=1.0)

        def progress(fraction: float, message: str) -> None:
            bar.update(task, completed=fraction, description=message)

        path = ensure_model(model, seed=seed, directory=directory, progress=progress, steps=steps,
                            measure=measure_quality)
    build = json.loads((path / MARKER).read_text())
    result = {"path": str(path), **build}
    if as_json:
        print_json(result)
        return
    console().print(f"{model} ready at [bold]{path}[/]")
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
    source: Path | None = typer.Option(None, "--from", help="A built-in model's checkpoint directory (default: the built-in build of --model and --seed)."),
    model: options.BuiltinModel = "tiny-ling",
    seed: int = typer.Option(0, "--seed", help="Which built-in build to export (without --from)."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="Dtype of the unquantised tensors: bfloat16 or float32."),
    weights: str = typer.Option("bf16", "--weights", help="Linear weights layout: bf16; fp8 (block-128 FP8, Ling's -fp8); "
                                "mxfp4 (MXFP4 routed experts, FP8 elsewhere, Ling's -fp4)."),
    damage_scale: bool = typer.Option(False, "--debug-damage-scale", help="DEBUG: write one expert's scale wrong "
                                      "(x64), so that the known-answer check has something to catch."),
    as_json: options.Json = False,
) -> None:
    """Write a built-in model as a Hugging Face checkpoint that stock SGLang serves with its own
    model code (`--trust-remote-code`), NextN layer and tokenizer included (tiny-ling as a
    BailingMoeV2, tiny-ling-v3 as a BailingMoeV3); with --weights fp8 or
    mxfp4 in the layout of the published Ling -fp8 / -fp4 checkpoints, with the
    quantization_config SGLang reads. The embedded engine loads every export too. An export that
    is already complete (same build, dtype and layout) is reused."""
    from sparkit.cli.common import console, err_console, print_json
    from sparkit.engines.embedded.quality import measure_quality
    from sparkit.models import checkpoint
    from sparkit.models.builder import ensure_model

    if source is None:
        source = ensure_model(model, seed=seed, measure=measure_quality)
    destination = directory or checkpoint.hf_export_dir(source, dtype, weights, damage_scale)
    err_console().print(f"exporting {source} ({weights}) ...", highlight=False)
    checkpoint.ensure_hf_export(source, destination, dtype, weights, damage_scale)
    marker = json.loads((destination / checkpoint.EXPORT_MARKER).read_text())
    result = {"path": str(destination), **marker}
    if as_json:
        print_json(result)
        return
    layout = "" if weights == "bf16" else f", {marker['layout']}"
    console().print(f"exported {source} -> [bold]{destination}[/] ({marker['architecture']}, {dtype}{layout}, "
                    f"{marker['tensors']} tensors)", highlight=False)
    if marker.get("damaged_scale"):
        console().print(f"[yellow]deliberately damaged:[/] {marker['damaged_scale']['tensor']} "
                        f"x{marker['damaged_scale']['factor']}", highlight=False)
    console().print(f"serve it: python -m sglang.launch_server --model-path {destination} --trust-remote-code", highlight=False)


@model_app.command("make-dspark")
def make_dspark(
    directory: Path | None = typer.Argument(None, help="Where to build it (default: sparkit's cache, models/DRAFT-s{SEED})."),
    draft: str = typer.Option("tiny-ling-dspark", "--draft", help="Which built-in draft: tiny-ling-dspark (for tiny-ling) "
                              "or tiny-ling-v3-dspark (for tiny-ling-v3)."),
    seed: int = typer.Option(0, "--seed", help="Initialisation and data seed."),
    steps: int | None = typer.Option(None, "--steps", min=0, help="Optimiser steps (default: the shipped build's; fewer "
                                     "skip the quality gate; 0 = an untrained draft)."),
    as_json: options.Json = False,
) -> None:
    """Train a DSpark block draft (SGLang's LingDSparkModel) for tiny-ling or tiny-ling-v3 on CPU and save it; reuses a complete build.

    The draft learns the target's own greedy text (regenerated over its corpus's prompts) and
    computes with the target's embedding and lm_head; the directory is what SGLang's
    --speculative-draft-model-path loads. The default build ships with sparkit."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from sparkit.cli.common import console, err_console, print_json
    from sparkit.engines.embedded.quality import measure_draft_quality
    from sparkit.models.dspark.builder import ensure_draft
    from sparkit.models.dspark.checkpoint import MARKER

    with Progress(
        TextColumn(f"[bold]{draft}[/]"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
        TextColumn("{task.description}"), console=err_console(), transient=as_json,
    ) as bar:
        task = bar.add_task("starting", total=1.0)

        def progress(fraction: float, message: str) -> None:
            bar.update(task, completed=fraction, description=message)

        path = ensure_draft(draft, seed=seed, directory=directory, progress=progress, steps=steps,
                            measure=measure_draft_quality)
    build = json.loads((path / MARKER).read_text())
    if as_json:
        print_json({"path": str(path), **build})
        return
    console().print(f"{draft} ready at [bold]{path}[/]")
    quality = build.get("quality") or {}
    details = ", ".join(f"{k} {build[k]}" for k in ("parameters", "train_steps", "loss") if k in build)
    if quality:
        details += (f", greedy accept length {quality['accept_length']} (NEXTN 3/1/4 on the same prompts: "
                    f"{quality['nextn_accept_length']})")
    console().print(details, highlight=False)


@model_app.command("export-dspark")
def export_dspark_cmd(
    directory: Path = typer.Argument(..., help="Where to write the draft as SGLang loads it."),
    source: Path | None = typer.Option(None, "--from", help="A DSpark draft directory (default: the built-in draft of --seed)."),
    draft: str = typer.Option("tiny-ling-dspark", "--draft", help="Which built-in draft to export (without --from): "
                              "tiny-ling-dspark or tiny-ling-v3-dspark."),
    seed: int = typer.Option(0, "--seed", help="Which built-in draft to export (without --from)."),
    as_json: options.Json = False,
) -> None:
    """Write a DSpark draft where SGLang will read it: config.json in SGLang's keys
    (LingDSparkModel, block_size, target_layer_ids, mask_token_id, markov_rank, ...) and
    model.safetensors in SGLang's tensor names, the embedding and lm_head left to the target."""
    from sparkit.cli.common import console, err_console, print_json
    from sparkit.engines.embedded.quality import measure_draft_quality
    from sparkit.models.dspark import checkpoint
    from sparkit.models.dspark.builder import ensure_draft

    if source is None:
        source = ensure_draft(draft, seed=seed, measure=measure_draft_quality)
    err_console().print(f"exporting {source} ...", highlight=False)
    marker = checkpoint.export(source, directory)
    if as_json:
        print_json({"path": str(directory), **marker})
        return
    console().print(f"exported {source} -> [bold]{directory}[/] ({marker['architecture']}, block {marker['block_size']}, "
                    f"{marker['tensors']} tensors)", highlight=False)
    console().print(f"serve it beside its target: python -m sglang.launch_server --model-path TARGET --trust-remote-code "
                    f"--speculative-algorithm DSPARK --speculative-draft-model-path {directory} "
                    "--attention-backend triton --speculative-draft-attention-backend triton", highlight=False)
