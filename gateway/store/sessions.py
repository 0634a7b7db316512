"""Sessions' records, and what a restarted gateway needs to reattach to their kernels."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from .base import ListedSession, OpenSession
from .claims import RELEASE
from .database import Repository


class Sessions(Repository):
    """The ``sessions`` table (read with ``leases``: which gateway's sessions they are)."""

    def save_session(
        self, doc: dict[str, Any], runtime: dict[str, Any] | None = None
    ) -> asyncio.Future:
        """Insert or replace a session's record, and what reattaching to it needs.

        ``runtime`` (connection info, key, container) is kept only while the
        session is open: an ended session has nothing to reattach to.
        """
        kept = json.dumps(runtime) if runtime is not None and not doc["ended_at"] else None
        row = (doc["id"], doc.get("tenant", "default"), doc["state"], doc["created_at"],
               doc["ended_at"], json.dumps(doc), kept)  # fmt: skip
        return self.db.submit(self._save, row, quick=True)

    def _save(self, row: tuple) -> None:
        """On the store's thread: the record; an ended session's claim on its quota goes back."""
        self.db.rows(
            "INSERT INTO sessions (id, tenant, state, created_at, ended_at, doc, runtime)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET state = excluded.state,"
            " ended_at = excluded.ended_at, doc = excluded.doc, runtime = excluded.runtime",
            row,
        )
        if row[4]:
            self.db.rows(RELEASE.format(now=self.db.dialect.now), (row[0],))

    async def get_session(self, session_id: str) -> dict[str, Any] | None:
        rows = await self.db.select("SELECT doc FROM sessions WHERE id = ?", (session_id,))
        return json.loads(rows[0]["doc"]) if rows else None

    async def open_page(
        self, tenant: str | None, state: str | None, after: tuple[str, str] | None, limit: int
    ) -> list[ListedSession]:
        """Open sessions of ``tenant`` (None: every tenant's) in ``state``, oldest first,
        ``limit`` of them past ``after`` (a created_at and id), with the gateway holding
        each and when its lease was last renewed (None: none is held)."""
        where, params = ["ended_at IS NULL"], []
        for column, value in (("tenant", tenant), ("state", state)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if after is not None:
            where.append("(created_at > ? OR (created_at = ? AND id > ?))")
            params += [after[0], after[0], after[1]]
        rows = await self.db.select(
            "SELECT doc, owner, renewed_at FROM sessions LEFT JOIN leases ON session_id = id"
            f" WHERE {' AND '.join(where)} ORDER BY created_at, id LIMIT ?",
            (*params, limit),
        )
        return [(json.loads(r["doc"]), r["owner"], r["renewed_at"]) for r in rows]

    async def open_sessions(self, owner: str) -> list[OpenSession]:
        """Open sessions of ``owner`` (or of no one), with their runtime info.

        What a restart of that gateway must account for: never another
        gateway's sessions, whose leases say so.
        """
        return await self._open_sessions(
            "LEFT JOIN leases ON session_id = id WHERE ended_at IS NULL"
            " AND (owner IS NULL OR owner = ?)",
            owner,
        )

    async def orphans(self, owner: str) -> list[OpenSession]:
        """Open sessions whose owner's lease ran out: a dead gateway's, for ``owner`` to adopt."""
        return await self._open_sessions(
            f"JOIN leases ON session_id = id WHERE ended_at IS NULL AND owner <> ?"
            f" AND expires_at < {self.db.dialect.now}",
            owner,
        )

    async def _open_sessions(self, where: str, owner: str) -> list[OpenSession]:
        rows = await self.db.select(
            f"SELECT doc, runtime FROM sessions {where}"
            f" ORDER BY sessions.{self.db.dialect.row_order}",
            (owner,),
        )
        return [
            (json.loads(r["doc"]), json.loads(r["runtime"]) if r["runtime"] else None) for r in rows
        ]
