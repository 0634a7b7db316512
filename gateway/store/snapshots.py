"""Snapshots of sessions' kernel state and workspace, as records; they outlive their sessions."""

from __future__ import annotations

import json
from typing import Any

from .database import Repository


class Snapshots(Repository):
    """The ``snapshots`` table."""

    async def add_snapshot(self, doc: dict[str, Any]) -> None:
        await self.db.select(
            "INSERT INTO snapshots (id, tenant, session_id, created_at, size_bytes, doc)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (
                doc["id"],
                doc["tenant"],
                doc["session_id"],
                doc["created_at"],
                doc["size_bytes"],
                json.dumps(doc),
            ),
        )

    async def get_snapshot(self, snapshot_id: str) -> dict[str, Any] | None:
        rows = await self.db.select("SELECT doc FROM snapshots WHERE id = ?", (snapshot_id,))
        return json.loads(rows[0]["doc"]) if rows else None

    async def snapshots_of(self, session_id: str) -> list[dict[str, Any]]:
        return await self._docs("session_id", session_id)

    async def snapshots_of_tenant(self, tenant: str) -> list[dict[str, Any]]:
        return await self._docs("tenant", tenant)

    async def _docs(self, column: str, value: str) -> list[dict[str, Any]]:
        order = self.db.dialect.row_order
        rows = await self.db.select(
            f"SELECT doc FROM snapshots WHERE {column} = ? ORDER BY created_at, {order}", (value,)
        )
        return [json.loads(r["doc"]) for r in rows]

    async def snapshot_usage(self, tenant: str) -> tuple[int, int]:
        """How many snapshots a tenant keeps, and their bytes on disk."""
        rows = await self.db.select(
            "SELECT count(*), coalesce(sum(size_bytes), 0) FROM snapshots WHERE tenant = ?",
            (tenant,),
        )
        return rows[0][0], rows[0][1]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self.db.select("DELETE FROM snapshots WHERE id = ?", (snapshot_id,))
