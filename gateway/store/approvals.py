"""Approval requests of held executes, as records."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from .database import Repository


class Approvals(Repository):
    """The ``approvals`` table."""

    def save_approval(self, doc: dict[str, Any]) -> asyncio.Future:
        """Insert or replace an approval request's record."""
        return self.db.submit(
            self.db.rows,
            "INSERT INTO approvals (id, tenant, session_id, state, created_at, doc)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE"
            " SET state = excluded.state, doc = excluded.doc",
            (
                doc["id"],
                doc["tenant"],
                doc["session_id"],
                doc["state"],
                doc["created_at"],
                json.dumps(doc),
            ),
            quick=True,
        )

    async def approvals(
        self, tenant: str | None = None, state: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Approval records, oldest first, of one tenant (None: all) and state (None: any)."""
        where, params = [], []
        for column, value in (("tenant", tenant), ("state", state)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = "SELECT doc FROM approvals"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = await self.db.select(sql + " ORDER BY created_at, id LIMIT ?", (*params, limit))
        return [json.loads(r["doc"]) for r in rows]

    async def get_approval(self, approval_id: str) -> dict[str, Any] | None:
        rows = await self.db.select("SELECT doc FROM approvals WHERE id = ?", (approval_id,))
        return json.loads(rows[0]["doc"]) if rows else None
