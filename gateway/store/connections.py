"""Egress connections: every connection a session made through the proxy, allowed or denied."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from .base import HISTORY_PAGE
from .chain import Chain
from .database import Database, Repository


class Connections(Repository):
    """The ``connections`` table."""

    def __init__(self, db: Database, chain: Chain) -> None:
        super().__init__(db)
        self.chain = chain

    def add_connection(
        self, session_id: str, execution_id: int | None, record: dict[str, Any]
    ) -> asyncio.Future:
        """Append one egress connection of a session (and the execution it ran in), chained."""
        values = (session_id, execution_id, record["at"], json.dumps(record))
        return self.db.submit(
            self.chain.insert, "connection", values, session_id, lazy=True, quick=True
        )

    async def connections(
        self, session_id: str, after: int = 0, limit: int = HISTORY_PAGE
    ) -> tuple[list[dict[str, Any]], int | None]:
        """A page of a session's connections, oldest first, and the next page's cursor."""
        rows = await self.db.select(
            "SELECT id, execution_id, record FROM connections WHERE session_id = ? AND id > ?"
            " ORDER BY id LIMIT ?",
            (session_id, after, limit + 1),
        )
        page = [
            {"id": r["id"], "execution_id": r["execution_id"], **json.loads(r["record"])}
            for r in rows[:limit]
        ]
        return page, (page[-1]["id"] if len(rows) > limit else None)

    def network(self, execution_id: int) -> dict[str, Any] | None:
        """On the store's thread: what an execution's connections add up to (history, notebook)."""
        rows = self.db.rows(
            "SELECT record FROM connections WHERE execution_id = ? ORDER BY id", (execution_id,)
        )
        if not rows:
            return None
        records = [json.loads(r["record"]) for r in rows]
        return {
            "connections": len(records),
            "refused": sum(r["decision"] != "allowed" for r in records),
            "bytes_up": sum(r["bytes_up"] for r in records),
            "bytes_down": sum(r["bytes_down"] for r in records),
            "hosts": sorted({_reached(r) for r in records}),
        }


def _reached(connection: dict[str, Any]) -> str:
    """``host:port`` a connection went to (its TLS name if it sent one), bare if unparsed."""
    name = connection["sni"] or connection["host"]
    return f"{name}:{connection['port']}" if connection.get("port") else name
