"""Chat history: a small SQLite store in sparkit.paths.data_dir()/chat.sqlite3.

Each conversation holds its messages in order. An assistant message carries its
status (complete | stopped | interrupted) and its metrics, so a reopened chat
shows the same marks and figures it showed live.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkit.errors import DataError

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    model TEXT,
    server_url TEXT,
    system_prompt TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'complete',
    metrics TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""


def default_path() -> Path:
    from sparkit.paths import data_dir

    return data_dir() / "chat.sqlite3"


class HistoryError(DataError):
    """The chat history file cannot be used (not a database, a corrupted page, a full disk).
    Names the file and the exact command that moves it aside (exit 8)."""

    def __init__(self, path: Path, reason: str) -> None:
        import shlex

        aside = path.with_name(f"{path.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")
        super().__init__(
            f"{path}: the chat history cannot be used ({reason})",
            hint=f"move it aside and `sparkit chat` starts a new history (the old file is kept for recovery, "
                 f"e.g. `sqlite3 FILE .recover`): mv {shlex.quote(str(path))} {shlex.quote(str(aside))}",
        )
        self.path = path

    def __rich__(self) -> Any:
        # Inside the chat screen Textual renders an exception that has __rich__ instead of a
        # traceback with every local variable (conversation titles, messages); `sparkit chat`
        # then prints this error itself, so nothing more is shown here.
        from rich.text import Text

        return Text("")


@dataclass
class StoredMessage:
    id: int
    role: str  # system | user | assistant
    content: str
    status: str = "complete"  # complete | stopped | interrupted
    metrics: dict[str, Any] | None = None


@dataclass
class Conversation:
    id: int
    title: str
    model: str | None
    server_url: str | None
    system_prompt: str | None
    created_at: float
    updated_at: float
    messages: list[StoredMessage] = field(default_factory=list)


def _guarded(method):
    """SQLite errors of a store method become a HistoryError naming the file."""
    import functools

    @functools.wraps(method)
    def wrapper(self: ChatStore, *args: Any, **kwargs: Any) -> Any:
        with self._guard():
            return method(self, *args, **kwargs)

    return wrapper


class ChatStore:
    """One SQLite file; every write commits at once so a crash loses nothing said."""

    def __init__(self, path: Path | None = None) -> None:
        from sparkit.paths import ensure_dir, open_output

        self.path = Path(path) if path else default_path()
        self.failure: HistoryError | None = None  # the last error raised, for `sparkit chat` to report
        if self.path.is_dir():
            raise HistoryError(self.path, "it is a directory")
        ensure_dir(self.path.parent)
        # Created private (sparkit.paths) before SQLite opens it: its journal takes the file's mode.
        with open_output(self.path, "ab"):
            pass
        self._db: sqlite3.Connection | None = None
        try:
            self._open()
        except HistoryError:
            self.close()
            raise

    @_guarded
    def _open(self) -> None:
        self._db = sqlite3.connect(str(self.path), check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.executescript(SCHEMA)
        self._db.commit()
        # A damaged page would otherwise surface in the middle of a chat; every page is read once
        # here (milliseconds for years of chats).
        problems = [row[0] for row in self._db.execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            raise sqlite3.DatabaseError(f"corrupted: {problems[0]}")

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            self.failure = HistoryError(self.path, f"{type(exc).__name__}: {exc}")
            raise self.failure from None

    def close(self) -> None:
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()

    @_guarded
    def new_conversation(
        self, title: str, *, model: str | None = None, server_url: str | None = None, system_prompt: str | None = None
    ) -> int:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO conversations (title, model, server_url, system_prompt, created_at, updated_at) VALUES (?,?,?,?,?,?)",
            (title[:80] or "untitled", model, server_url, system_prompt, now, now),
        )
        self._db.commit()
        return int(cur.lastrowid)

    @_guarded
    def add_message(
        self, conversation_id: int, role: str, content: str, *, status: str = "complete", metrics: dict[str, Any] | None = None
    ) -> int:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO messages (conversation_id, role, content, status, metrics, created_at) VALUES (?,?,?,?,?,?)",
            (conversation_id, role, content, status, json.dumps(metrics) if metrics else None, now),
        )
        self._db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
        self._db.commit()
        return int(cur.lastrowid)

    @_guarded
    def update_message(
        self, message_id: int, *, content: str, status: str, metrics: dict[str, Any] | None = None
    ) -> None:
        self._db.execute(
            "UPDATE messages SET content = ?, status = ?, metrics = ? WHERE id = ?",
            (content, status, json.dumps(metrics) if metrics else None, message_id),
        )
        self._db.commit()

    @_guarded
    def list_conversations(self, limit: int = 200) -> list[Conversation]:
        """Most recently used first, without their messages."""
        rows = self._db.execute(
            "SELECT * FROM conversations ORDER BY updated_at DESC, id DESC LIMIT ?", (limit,)
        ).fetchall()
        return [self._conversation(row) for row in rows]

    @_guarded
    def load(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if row is None:
            return None
        conversation = self._conversation(row)
        for m in self._db.execute(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        ).fetchall():
            conversation.messages.append(
                StoredMessage(
                    id=m["id"],
                    role=m["role"],
                    content=m["content"],
                    status=m["status"],
                    metrics=json.loads(m["metrics"]) if m["metrics"] else None,
                )
            )
        return conversation

    @_guarded
    def delete(self, conversation_id: int) -> None:
        self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        self._db.commit()

    @staticmethod
    def _conversation(row: sqlite3.Row) -> Conversation:
        return Conversation(
            id=row["id"],
            title=row["title"],
            model=row["model"],
            server_url=row["server_url"],
            system_prompt=row["system_prompt"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )
