"""`sparkit model make-tiny`: build the tiny-ling checkpoint (parse, call the builder, render)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

model_app = typer.Typer(help="Built-in models: build tiny-ling, the embedded engine's model.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")


@model_app.command("make-tiny")
def make_tiny(
    directory: Optional[Path] = typer.Argument(None, help="Where to build it (default: sparkit's cache, models/tiny-ling-s{SEED})."),
    seed: int = typer.Option(0, "--seed", help="Initialisation and corpus seed (a different seed gives a different model)."),
    train_seconds: Optional[float] = typer.Option(None, "--train-seconds", min=1.0, help="Training time budget in seconds (default 90)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout (progress and messages on stderr)."),
) -> None:
    """Train tiny-ling (a miniature Ling MoE with an MTP layer) on CPU and save it; reuses a complete build."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from sparkit.cli.common import console, err_console, print_json
    from sparkit.engines.embedded.builder import MARKER, ensure_model

    with Progress(
        TextColumn("[bold]tiny-ling[/]"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
        TextColumn("{task.description}"), console=err_console(), transient=as_json,
    ) as bar:
        task = bar.add_task("starting", total=1.0)

        def progress(fraction: float, message: str) -> None:
            bar.update(task, completed=fraction, description=message)

        path = ensure_model("tiny-ling", seed=seed, directory=directory, progress=progress, train_seconds=train_seconds)
    build = json.loads((path / MARKER).read_text())
    result = {"path": str(path), **build}
    if as_json:
        print_json(result)
        return
    console().print(f"tiny-ling ready at [bold]{path}[/]")
    details = ", ".join(f"{k} {build[k]}" for k in ("parameters", "train_steps", "train_seconds", "final_loss", "final_mtp_loss") if k in build)
    if details:
        console().print(details, highlight=False)
