"""Chat history: a small SQLite store in sparkit.paths.data_dir()/chat.sqlite3.

Each conversation holds its messages in order. An assistant message carries its
status (complete | stopped | interrupted) and its metrics, so a reopened chat
shows the same marks and figures it showed live.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


class ChatStore:
    """One SQLite file; every write commits at once so a crash loses nothing said."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.executescript(SCHEMA)
        self._db.commit()

    def close(self) -> None:
        self._db.close()

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

    def update_message(
        self, message_id: int, *, content: str, status: str, metrics: dict[str, Any] | None = None
    ) -> None:
        self._db.execute(
            "UPDATE messages SET content = ?, status = ?, metrics = ? WHERE id = ?",
            (content, status, json.dumps(metrics) if metrics else None, message_id),
        )
        self._db.commit()

    def list_conversations(self, limit: int = 200) -> list[Conversation]:
        """Most recently used first, without their messages."""
        rows = self._db.execute(
            "SELECT * FROM conversations ORDER BY updated_at DESC, id DESC LIMIT ?", (limit,)
        ).fetchall()
        return [self._conversation(row) for row in rows]

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
