"""`sparkit chat`: the Textual chat app against a running server."""

from __future__ import annotations

from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("chat")
    def chat(
        run: Optional[str] = typer.Argument(None, help="Run id or recipe name (default: the latest live run)."),
        url: Optional[str] = typer.Option(None, "--url", help="Server URL instead of a run, e.g. http://127.0.0.1:30000."),
        model: Optional[str] = typer.Option(None, "--model", help="Model name sent with requests (default: the server's)."),
        system: Optional[str] = typer.Option(None, "--system", help="System prompt for new chats."),
        api_key: Optional[str] = typer.Option(None, "--api-key", envvar="SPARKIT_API_KEY", help="Bearer token, if the server needs one."),
        open_id: Optional[int] = typer.Option(None, "--open", help="Reopen a saved chat by id (see the history panel, Ctrl+O)."),
    ) -> None:
        """Chat in the terminal with live decode tok/s, TTFT and accept length.

        Keys: Enter sends, Esc stops a reply, Ctrl+N new chat, Ctrl+O history,
        Ctrl+Y copy reply, Ctrl+L copy the last code block, Ctrl+T settings, Ctrl+Q quit.
        """
        from sparkit.errors import SparkitError, UsageError
        from sparkit.runs import resolve_server
        from sparkit.tui.history import ChatStore

        if run and url:
            raise UsageError("give a RUN or --url, not both", hint="`sparkit chat --url http://127.0.0.1:30000`")
        store = ChatStore()  # an unusable history is exit 8 naming the file, before anything else
        try:
            if open_id is not None:
                _require_saved_chat(store, open_id)
            target = resolve_server(run, url, api_key)
            from sparkit.cli.common import require_server

            require_server(target.url, target.api_key)  # exit 7 here, not a chat screen that cannot chat
            from sparkit.tui.app import create_app

            app = create_app(
                target.url,
                api_key=target.api_key,
                model=model,
                system_prompt=system,
                run=target.run,
                open_conversation=open_id,
                store=store,
            )
            app.run()
        finally:
            store.close()
        if store.failure is not None:  # the history failed while the screen was up
            raise store.failure
        if app.interrupted_by is not None:  # SIGINT, SIGTERM or SIGHUP: exit 130, what was said is kept
            _say_interrupted(app, store)
            raise KeyboardInterrupt
        if app.return_code:  # the screen crashed (its report is above): never exit 0 for that
            raise SparkitError("the chat screen stopped on an internal error (shown above)",
                               hint="set SPARKIT_DEBUG=1 and report it; saved chats are in " + str(store.path))


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
