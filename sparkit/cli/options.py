"""The options and arguments several sparkit commands share, each declared once (pip's
`cmdoptions`): its flag, the word for its value and its help are here, so they read the same in
every command's --help. Each is a typer `Annotated` type; a command names it and gives the
Python default in its signature:

    def status(json_out: options.Json = False, ...) -> None:
    def plan_cmd(recipe: str = typer.Argument(...), set_: options.Overrides = (), ...) -> None:

An option whose meaning differs from one command to the next (`--out`: a results file, a sweep,
a profile) is declared with its command."""

from __future__ import annotations

from typing import Annotated

import typer

from sparkit.contract.flag_table import DEFAULT_PORT

Json = Annotated[bool, typer.Option("--json", help="One JSON document on stdout (progress and messages on stderr).")]

# Repeatable; its default is `()` (typer passes a list).
Overrides = Annotated[list[str], typer.Option(
    "--set", metavar="KEY=VALUE",
    help="Override a recipe key, e.g. --set stack.lm_head=fp8 (value read as YAML). Repeatable.")]

# Which server a client command talks to: a run sparkit started (RUN), or any server (--url),
# and the key it sends (sparkit/api_key.py resolves the default).
ServerRun = Annotated[str | None, typer.Argument(
    help="Run id, id prefix or recipe name of a started server (default: the latest live run).")]
Url = Annotated[str | None, typer.Option(
    "--url", metavar="URL", help=f"Server URL instead of a run, e.g. http://127.0.0.1:{DEFAULT_PORT}.")]
ApiKey = Annotated[str | None, typer.Option(
    "--api-key", metavar="KEY",
    help="Bearer key to send (default: a run's key, from its recipe's server.api_key_env; else $SPARKIT_API_KEY "
         "for a --url server sparkit did not start).")]

# What `up` and `run` start.
LaunchRecipe = Annotated[str | None, typer.Argument(
    help="Recipe file or shipped name (default: the tiny CPU recipe).")]
HealthTimeout = Annotated[float, typer.Option(
    "--timeout", metavar="SECONDS", help="Seconds to wait for the server to become healthy.")]

# The synthetic workload of `bench` and `tune`.
PromptSeed = Annotated[int, typer.Option("--seed", help="Seed for the random prompts.")]

# What `chat` and `run` send.
ChatModel = Annotated[str | None, typer.Option(
    "--model", metavar="NAME", help="Model name sent with requests (default: the server's).")]
SystemPrompt = Annotated[str | None, typer.Option("--system", metavar="TEXT", help="System prompt for new chats.")]

# `sparkit model make-tiny` and `export-hf`: which built-in model.
BuiltinModel = Annotated[str, typer.Option(
    "--model", help="Which built-in model: tiny-ling (a BailingMoeV2) or tiny-ling-v3 (a BailingMoeV3: KDA + gated MLA).")]
