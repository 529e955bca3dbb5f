"""The SQLite chat history."""

from __future__ import annotations

import pytest

from sparkit.tui.history import ChatStore, default_path


def test_a_conversation_survives_reopening_the_store(tmp_path):
    path = tmp_path / "chat.sqlite3"
    store = ChatStore(path)
    cid = store.new_conversation("first chat", model="tiny", server_url="http://x", system_prompt="be brief")
    store.add_message(cid, "system", "be brief")
    store.add_message(cid, "user", "hi")
    reply_id = store.add_message(cid, "assistant", "", status="interrupted")
    store.update_message(reply_id, content="hel", status="stopped", metrics={"output_tokens": 3, "t_start": 0.0})
    store.close()

    again = ChatStore(path)
    [summary] = again.list_conversations()
    assert (summary.id, summary.title, summary.model, summary.system_prompt) == (cid, "first chat", "tiny", "be brief")
    conversation = again.load(cid)
    assert [(m.role, m.content, m.status) for m in conversation.messages] == [
        ("system", "be brief", "complete"),
        ("user", "hi", "complete"),
        ("assistant", "hel", "stopped"),
    ]
    assert conversation.messages[-1].metrics == {"output_tokens": 3, "t_start": 0.0}


def test_most_recently_used_conversations_come_first_and_delete_removes_messages(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite3")
    a = store.new_conversation("a")
    b = store.new_conversation("b")
    store.add_message(a, "user", "later message makes a the most recent")
    assert [c.title for c in store.list_conversations()] == ["a", "b"]
    store.delete(a)
    assert [c.id for c in store.list_conversations()] == [b]
    assert store.load(a) is None
    assert store._db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


def test_the_default_store_lives_in_the_data_dir(sparkit_home):
    assert default_path() == sparkit_home / "data" / "chat.sqlite3"
    store = ChatStore()
    assert store.path.exists()


# -- an unusable history: named, with the command that moves it aside, never a crash -------------

TITLE = "my private chat title"


def filled_history(path, conversations: int = 40):
    """A real history over many pages (so that one can be damaged without touching the header)."""
    store = ChatStore(path)
    for i in range(conversations):
        cid = store.new_conversation(f"{TITLE} {i}")
        for _ in range(6):
            store.add_message(cid, "user", "a line of conversation " * 30)
    store.close()
    assert path.stat().st_size > 40 * 4096
    return path


def damage_page(path, page: int = 20) -> None:
    """Overwrite one page in the middle, as a bad sector or a torn copy would, and bump the header's
    change counter (what any other writer does), so an open connection reads it afresh."""
    with open(path, "r+b") as handle:
        page_size = int.from_bytes(handle.read(18)[16:18], "big")
        handle.seek(page_size * (page - 1))
        handle.write(b"\xa5" * page_size)
        handle.seek(24)
        counter = int.from_bytes(handle.read(4), "big")
        handle.seek(24)
        handle.write((counter + 1).to_bytes(4, "big"))


def chat_cli(home, *args):
    import os
    import subprocess
    import sys

    env = {**os.environ, "SPARKIT_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "sparkit", "chat", *args], env=env, capture_output=True, text=True, timeout=120)


def check_named_with_the_move_aside_command(result, path) -> None:
    import shlex
    import subprocess

    assert result.returncode == 8, result.stderr
    assert str(path) in result.stderr and "the chat history cannot be used" in result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert TITLE not in result.stdout + result.stderr  # no conversation shown in an error
    command = result.stderr.split("hint:", 1)[1].split(": mv ", 1)[1].strip()
    subprocess.run(["mv", *shlex.split(" ".join(command.split()))], check=True)  # the exact command it gave
    assert not path.exists() and list(path.parent.glob(path.name + ".broken-*"))
    ChatStore(path).close()  # a new history starts


def test_garbage_instead_of_a_history_is_named(sparkit_home):
    path = default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is not a database\x00" * 300)
    result = chat_cli(sparkit_home, "--url", "http://127.0.0.1:9")  # the history is checked first
    assert "file is not a database" in result.stderr
    check_named_with_the_move_aside_command(result, path)


@pytest.mark.slow
def test_a_damaged_page_is_found_before_the_chat_screen_opens(sparkit_home):
    path = filled_history(default_path())
    damage_page(path)
    result = chat_cli(sparkit_home, "--url", "http://127.0.0.1:9")
    assert "malformed" in result.stderr
    check_named_with_the_move_aside_command(result, path)


def test_a_page_damaged_while_the_store_is_open_is_a_history_error(tmp_path):
    import sqlite3

    import pytest

    from sparkit.tui.history import HistoryError

    path = filled_history(tmp_path / "chat.sqlite3")
    store = ChatStore(path)
    damage_page(path)
    with pytest.raises(HistoryError) as info:
        for c in store.list_conversations():
            store.load(c.id)
    assert info.value.exit_code == 8 and str(path) in str(info.value) and store.failure is info.value
    assert not isinstance(info.value, sqlite3.Error)
