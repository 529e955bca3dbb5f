"""The SQLite chat history."""

from __future__ import annotations

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
