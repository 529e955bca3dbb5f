"""`sparkit chat`: the Textual chat app against a running server (on a terminal with none running,
it offers to start the default recipe). What `run` shares: the chat store, the screen, a server
started for one chat."""

from __future__ import annotations

import sys
from typing import Any

import typer

from sparkit.cli import options
from sparkit.contract.flag_table import DEFAULT_PORT


def chat(
    run: options.ServerRun = None,
    url: options.Url = None,
    model: options.ChatModel = None,
    system: options.SystemPrompt = None,
    api_key: options.ApiKey = None,
    open_id: int | None = typer.Option(None, "--open", metavar="ID", help="Reopen a saved chat by id (see the history panel, Ctrl+O)."),
) -> None:
    """Keys: Enter sends, Esc stops a reply, Ctrl+N new chat, Ctrl+O history,
    Ctrl+Y copy reply, Ctrl+L copy the last code block, Ctrl+T settings, Ctrl+Q quit.
    With no server running, on a terminal it offers to start the default recipe for this chat.
    """
    from sparkit.errors import EngineError, UsageError
    from sparkit.runs import resolve_server

    if run and url:
        raise UsageError("give a RUN or --url, not both", hint=f"`sparkit chat --url http://127.0.0.1:{DEFAULT_PORT}`")
    with chat_store() as store:  # an unusable history is exit 8 naming the file, before anything else
        if open_id is not None:
            _require_saved_chat(store, open_id)
        try:
            target = resolve_server(run, url, api_key)
        except EngineError:
            if run or url or not _offer_default_recipe():
                raise  # not a terminal, or declined: the clear exit 7 as before
            chat_on_a_new_server(None, [], None, keep=False, timeout=600.0, store=store, model=model,
                                  system=system, open_id=open_id)
            return
        open_chat(target, store=store, model=model, system=system, open_id=open_id)


class chat_store:
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


def chat_on_a_new_server(recipe: str | None, set_: list[str], port: str | None, *, keep: bool, timeout: float,
                          store: Any, model: str | None, system: str | None, open_id: int | None = None) -> None:
    """`up` the recipe (its preflight and startup checks shown), chat, then stop it unless `keep`."""
    from sparkit.cli.commands.up import report_started, start
    from sparkit.cli.common import err_console
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
