"""The audit log: who did what, when, to which session, and how it went."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from .base import AUDIT_FILTERS
from .chain import Chain
from .database import Database, Repository


class Audit(Repository):
    """The ``audit`` table."""

    def __init__(self, db: Database, chain: Chain) -> None:
        super().__init__(db)
        self.chain = chain

    def add_audit(self, event: dict[str, Any]) -> asyncio.Future:
        """Append one audit event, chained; returns the write's future (callers need not wait)."""
        values = (
            event["at"],
            event.get("tenant"),
            event.get("token_id"),
            event["action"],
            event.get("session_id"),
            event["outcome"],
            event.get("status"),
            event.get("remote"),
            json.dumps(event["detail"]) if event.get("detail") else None,
        )
        return self.db.submit(
            self.chain.insert, "audit", values, values[4], values[1] or "", lazy=True, quick=True
        )

    async def audit_events(
        self,
        filters: dict[str, str],
        since: str | None = None,
        until: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """Audit events matching every filter, newest first."""
        where = [f"{name} = ?" for name in AUDIT_FILTERS if name in filters]
        params: list[Any] = [filters[name] for name in AUDIT_FILTERS if name in filters]
        if since:
            where.append("at >= ?")
            params.append(since)
        if until:
            where.append("at < ?")
            params.append(until)
        sql = "SELECT * FROM audit"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = await self.db.select(sql + " ORDER BY id DESC LIMIT ?", (*params, limit))
        return [
            {**dict(r), "detail": json.loads(r["detail"]) if r["detail"] else None} for r in rows
        ]
