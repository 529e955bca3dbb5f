"""`sparkit chat`: the Textual chat app against a running server; `sparkit run`: a recipe's server
brought up for a chat and stopped after it."""

from __future__ import annotations

import sys
from typing import Any

import typer


def register(app: typer.Typer) -> None:
    @app.command("chat")
    def chat(
        run: str | None = typer.Argument(None, help="Run id or recipe name (default: the latest live run)."),
        url: str | None = typer.Option(None, "--url", help="Server URL instead of a run, e.g. http://127.0.0.1:30000."),
        model: str | None = typer.Option(None, "--model", help="Model name sent with requests (default: the server's)."),
        system: str | None = typer.Option(None, "--system", help="System prompt for new chats."),
        api_key: str | None = typer.Option(None, "--api-key", help="Bearer key to send (default: a run's key, from its recipe's server.api_key_env; else $SPARKIT_API_KEY for a --url server sparkit did not start)."),
        open_id: int | None = typer.Option(None, "--open", help="Reopen a saved chat by id (see the history panel, Ctrl+O)."),
    ) -> None:
        """Chat in the terminal with live decode tok/s, TTFT and accept length.

        Keys: Enter sends, Esc stops a reply, Ctrl+N new chat, Ctrl+O history,
        Ctrl+Y copy reply, Ctrl+L copy the last code block, Ctrl+T settings, Ctrl+Q quit.
        With no server running, on a terminal it offers to start the default recipe for this chat.
        """
        from sparkit.errors import EngineError, UsageError
        from sparkit.runs import resolve_server

        if run and url:
            raise UsageError("give a RUN or --url, not both", hint="`sparkit chat --url http://127.0.0.1:30000`")
        with _chat_store() as store:  # an unusable history is exit 8 naming the file, before anything else
            if open_id is not None:
                _require_saved_chat(store, open_id)
            try:
                target = resolve_server(run, url, api_key)
            except EngineError:
                if run or url or not _offer_default_recipe():
                    raise  # not a terminal, or declined: the clear exit 7 as before
                _chat_on_a_new_server(None, [], None, keep=False, timeout=600.0, store=store, model=model,
                                      system=system, open_id=open_id)
                return
            open_chat(target, store=store, model=model, system=system, open_id=open_id)

    @app.command("run")
    def run_cmd(
        recipe: str | None = typer.Argument(None, help="Recipe file or shipped name (default: the tiny CPU recipe)."),
        set_: list[str] = typer.Option([], "--set", help="Override a recipe value: a.b=c (repeatable)."),
        port: str = typer.Option("auto", "--port", help="'auto' (a free port, the default) or a port number."),
        keep: bool = typer.Option(False, "--keep", help="Leave the server running when the chat closes (`sparkit down` stops it)."),
        timeout: float = typer.Option(600.0, "--timeout", help="Seconds to wait for the server to become healthy."),
        model: str | None = typer.Option(None, "--model", help="Model name sent with requests (default: the server's)."),
        system: str | None = typer.Option(None, "--system", help="System prompt for new chats."),
    ) -> None:
        """Chat with a recipe: a server running it is reused, else one is brought up (preflight,
        startup checks) and stopped when the chat closes (--keep leaves it running)."""
        from sparkit.cli.common import signals_as_interrupt

        signals_as_interrupt()
        with _chat_store() as store:
            reused = None if set_ else _live_run_of(recipe)
            if reused is not None:
                from sparkit.cli.common import err_console
                from sparkit.runs import Server

                err_console().print(f"{reused.recipe_name} is already running: run {reused.id} at {reused.url} "
                                    "(left running after the chat)", highlight=False, soft_wrap=True)
                open_chat(Server(reused.url, reused.api_key, reused), store=store, model=model, system=system)
                return
            _chat_on_a_new_server(recipe, list(set_), port, keep=keep, timeout=timeout, store=store, model=model,
                                  system=system)


class _chat_store:
    """The chat history, closed however the command ends; a failure of the store while the screen
    was up is raised after it."""

    def __enter__(self) -> Any:
        from sparkit.tui.history import ChatStore

        self.store = ChatStore()
        return self.store

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        self.store.close()
        if kind is None and self.store.failure is not None:
            raise self.store.failure
        return False


def open_chat(target: Any, *, store: Any, model: str | None = None, system: str | None = None,
              open_id: int | None = None) -> None:
    """The chat screen against `target` (a sparkit.runs.Server); exit 7 when nothing answers."""
    from sparkit.cli.common import require_server
    from sparkit.errors import SparkitError
    from sparkit.tui.app import create_app

    require_server(target.url, target.api_key)  # exit 7 here, not a chat screen that cannot chat
    app = create_app(target.url, api_key=target.api_key, model=model, system_prompt=system, run=target.run,
                     open_conversation=open_id, store=store)
    app.run()
    if store.failure is not None:  # the history failed while the screen was up: exit 8, before the rest
        raise store.failure
    if app.interrupted_by is not None:  # SIGINT, SIGTERM or SIGHUP: exit 130, what was said is kept
        _say_interrupted(app, store)
        raise KeyboardInterrupt
    if app.return_code:  # the screen crashed (its report is above): never exit 0 for that
        raise SparkitError("the chat screen stopped on an internal error (shown above)",
                           hint="set SPARKIT_DEBUG=1 and report it; saved chats are in " + str(store.path))


def _chat_on_a_new_server(recipe: str | None, set_: list[str], port: str | None, *, keep: bool, timeout: float,
                          store: Any, model: str | None, system: str | None, open_id: int | None = None) -> None:
    """`up` the recipe (its preflight and startup checks shown), chat, then stop it unless `keep`."""
    from sparkit.cli.common import err_console
    from sparkit.cli.serve_cmd import report_started, start
    from sparkit.runs import stop

    started, plan = start(recipe, set_, port, detach=keep, timeout=timeout)
    run = started.run
    try:
        report_started(started, plan, json_out=False, keep_on_fail=False, detach=True, stderr=True)
        open_chat(started.server, store=store, model=model, system=system, open_id=open_id)
    finally:
        if not keep and run.reload().live:
            stop(run)
            err_console().print(f"stopped run {run.id} (started for this chat; --keep leaves it running)",
                                highlight=False, soft_wrap=True)
    if keep:
        err_console().print(f"left running: run {run.id} at {plan.url} (`sparkit down {run.id}` stops it)",
                            highlight=False, soft_wrap=True)


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


def _offer_default_recipe() -> bool:
    """On a terminal (stdin and stdout), ask whether to start the default recipe for this chat."""
    from sparkit.cli.common import err_console, is_terminal
    from sparkit.recipes.load import DEFAULT_RECIPE

    if not (is_terminal(sys.stdin) and is_terminal(sys.stdout)):
        return False
    err_console().print(f"no server is running. Start the default recipe ({DEFAULT_RECIPE}: tiny-ling on the embedded "
                        "engine) for this chat? It is stopped when the chat closes (`sparkit run` does the same).",
                        highlight=False)
    return typer.confirm("start it", default=True, err=True)


def _say_interrupted(app, store) -> None:
    """One line on stderr, if there is still somewhere to show it (after SIGHUP there may not be)."""
    import signal
    import sys

    name = signal.Signals(app.interrupted_by).name
    where = f"; reopen it with `sparkit chat --open {app.conversation_id}`" if app.conversation_id is not None else ""
    try:
        print(f"interrupted ({name}): the chat is saved, a reply in progress kept as far as it came{where}",
              file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _require_saved_chat(store, conversation_id: int) -> None:
    """`--open N` of a chat that does not exist is a usage error, not a silent new chat."""
    from sparkit.errors import UsageError

    found = store.load(conversation_id)
    recent = [c.id for c in store.list_conversations(limit=5)]
    if found is None:
        raise UsageError(
            f"--open {conversation_id}: no saved chat with that id",
            hint=f"recent chats: {', '.join(map(str, recent))} (Ctrl+O in `sparkit chat` lists them)" if recent
            else "no chats saved yet: `sparkit chat` starts one",
        )
