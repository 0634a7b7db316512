"""SQLite persistence for sessions and executions.

One connection lives on one dedicated thread: sqlite3 objects must stay on
the thread that made them, and a single writer never contends for the WAL
lock. Callers await the results, so the event loop never blocks on disk.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    created_at TEXT NOT NULL,
    ended_at TEXT,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_open ON sessions (ended_at);
CREATE TABLE IF NOT EXISTS executions (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (id),
    execution_count INTEGER,
    status TEXT NOT NULL,
    code TEXT NOT NULL,
    description TEXT,
    outputs TEXT NOT NULL,
    truncated INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    started_at TEXT NOT NULL,
    ended_at TEXT NOT NULL,
    duration_ms REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS executions_by_session ON executions (session_id, id);
"""


class Store:
    """Async facade over the gateway's SQLite database."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sbx-store")
        self._db: sqlite3.Connection | None = None

    async def open(self) -> None:
        await self._run(self._open)

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA foreign_keys=ON")
        db.executescript(SCHEMA)
        self._db = db

    async def close(self) -> None:
        if self._db is not None:
            await self._run(self._db.close)
            self._db = None
        self._pool.shutdown(wait=True)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _exec(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        assert self._db is not None, "store is not open"
        return self._db.execute(sql, params).fetchall()

    async def gateway_id(self) -> str:
        """Return this data directory's stable id, used to label its containers."""

        def get_or_create() -> str:
            rows = self._exec("SELECT value FROM meta WHERE key = 'gateway_id'")
            if rows:
                return rows[0]["value"]
            new = uuid.uuid4().hex[:12]
            self._exec("INSERT INTO meta (key, value) VALUES ('gateway_id', ?)", (new,))
            return new

        return await self._run(get_or_create)

    async def save_session(self, doc: dict[str, Any]) -> None:
        """Insert or replace a session's record."""
        await self._run(
            self._exec,
            "INSERT INTO sessions (id, state, created_at, ended_at, doc) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET state = excluded.state,"
            " ended_at = excluded.ended_at, doc = excluded.doc",
            (doc["id"], doc["state"], doc["created_at"], doc.get("ended_at"), json.dumps(doc)),
        )

    async def get_session(self, session_id: str) -> dict[str, Any] | None:
        rows = await self._run(self._exec, "SELECT doc FROM sessions WHERE id = ?", (session_id,))
        return json.loads(rows[0]["doc"]) if rows else None

    async def open_sessions(self) -> list[dict[str, Any]]:
        """Sessions not marked ended: what a restarted gateway must account for."""
        rows = await self._run(self._exec, "SELECT doc FROM sessions WHERE ended_at IS NULL")
        return [json.loads(r["doc"]) for r in rows]

    async def add_execution(self, session_id: str, record: dict[str, Any]) -> None:
        await self._run(
            self._exec,
            "INSERT INTO executions (session_id, execution_count, status, code, description,"
            " outputs, truncated, error, started_at, ended_at, duration_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id,
                record["execution_count"],
                record["status"],
                record["code"],
                record.get("description"),
                json.dumps(record["outputs"]),
                bool(record.get("truncated")),
                json.dumps(record["error"]) if record["error"] else None,
                record["started_at"],
                record["ended_at"],
                record["duration_ms"],
            ),
        )

    async def history(self, session_id: str) -> list[dict[str, Any]]:
        """Every recorded execution of a session, oldest first."""
        rows = await self._run(
            self._exec,
            "SELECT * FROM executions WHERE session_id = ? ORDER BY id",
            (session_id,),
        )
        return [
            {
                "id": r["id"],
                "execution_count": r["execution_count"],
                "status": r["status"],
                "code": r["code"],
                "description": r["description"],
                "truncated": bool(r["truncated"]),
                "outputs": json.loads(r["outputs"]),
                "error": json.loads(r["error"]) if r["error"] else None,
                "started_at": r["started_at"],
                "ended_at": r["ended_at"],
                "duration_ms": r["duration_ms"],
            }
            for r in rows
        ]
