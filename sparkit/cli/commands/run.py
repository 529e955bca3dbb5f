"""`sparkit run`: `up` and `chat` in one; a server already running the recipe is reused, one it
started is stopped when the chat closes (--keep leaves it)."""

from __future__ import annotations

from typing import Any

import typer

from sparkit.cli import options
from sparkit.cli.commands.chat import chat_on_a_new_server, chat_store, open_chat


def run_cmd(
    recipe: options.LaunchRecipe = None,
    set_: options.Overrides = (),
    port: str = typer.Option("auto", "--port", metavar="PORT", help="'auto' (a free port, the default) or a port number."),
    keep: bool = typer.Option(False, "--keep", help="Leave the server running when the chat closes (`sparkit down` stops it)."),
    timeout: options.HealthTimeout = 600.0,
    model: options.ChatModel = None,
    system: options.SystemPrompt = None,
) -> None:
    from sparkit.cli.common import signals_as_interrupt

    signals_as_interrupt()
    with chat_store() as store:
        reused = None if set_ else _live_run_of(recipe)
        if reused is not None:
            from sparkit.cli.common import err_console
            from sparkit.runs import Server

            err_console().print(f"{reused.recipe_name} is already running: run {reused.id} at {reused.url} "
                                "(left running after the chat)", highlight=False, soft_wrap=True)
            open_chat(Server(reused.url, reused.api_key, reused), store=store, model=model, system=system)
            return
        chat_on_a_new_server(recipe, list(set_), port, keep=keep, timeout=timeout, store=store, model=model,
                              system=system)


def _live_run_of(recipe: str | None) -> Any:
    """A live run of the recipe (by its name, or the file's), else None."""
    from sparkit.errors import SparkitError
    from sparkit.recipes.load import DEFAULT_RECIPE, load_recipe
    from sparkit.runs import live_runs

    try:
        name = load_recipe(recipe or DEFAULT_RECIPE).name
    except SparkitError:
        return None  # `start` reports the recipe's mistake
    same = [r for r in live_runs() if r.recipe_name == name]
    return same[-1] if same else None
