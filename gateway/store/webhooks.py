"""Lifecycle webhook deliveries: one row per event and endpoint, every attempt in its log.

A row is ``pending`` until a gateway claims it (``sending``, for a lease's time),
then ``delivered``, ``pending`` again with a later ``due_at`` (a retry), or
``failed``; ``dropped`` when its endpoint already had too many waiting. The claim
is one ``UPDATE ... WHERE state = 'pending' ... RETURNING``: on PostgreSQL a
second gateway's update waits for the first one's row lock, then finds the row
no longer pending, so each attempt is made by one gateway. A row is claimed only
once every earlier row of its session and endpoint is finished: events arrive in
order. An endpoint has one attempt in flight at a time, and endpoints take turns
(each one's oldest due row), so a receiver that never answers holds one slot, not
every other tenant's. A claim whose gateway died is due again once its lease runs out.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from .database import Repository

COLUMNS = (
    "seq, id, event_id, type, tenant, endpoint, session_id, body, state, attempts, due_at,"
    " created_at, finished_at, log, replay_of"
)
DUE = (
    "({d}state = 'pending' AND {d}due_at <= {now}"
    " OR {d}state = 'sending' AND {d}claimed_until < {now})"
)
FIRST_IN_LINE = (
    "NOT EXISTS (SELECT 1 FROM webhook_deliveries o WHERE o.tenant = d.tenant"
    " AND o.endpoint = d.endpoint AND o.session_id = d.session_id AND o.seq < d.seq"
    " AND o.state IN ('pending', 'sending'))"
)
IDLE = (  # the endpoint has no attempt in flight (a dead gateway's claim no longer counts)
    "NOT EXISTS (SELECT 1 FROM webhook_deliveries b WHERE b.tenant = d.tenant"
    " AND b.endpoint = d.endpoint AND b.state = 'sending' AND b.claimed_until >= {now})"
)


def _row(row: Any) -> dict[str, Any]:
    doc = dict(row)
    doc["log"] = json.loads(doc["log"])
    return doc


class WebhookDeliveries(Repository):
    """The ``webhook_deliveries`` table."""

    def add_deliveries(self, rows: list[dict[str, Any]], cap: int) -> asyncio.Future:
        """Queue deliveries (id, event_id, type, tenant, endpoint, session_id, body), due now.

        One whose endpoint already has ``cap`` waiting is recorded as ``dropped``.
        """
        return self.db.submit(self._add, rows, cap)  # a count and inserts: never on the loop

    def _add(self, rows: list[dict[str, Any]], cap: int) -> None:
        now = self.db.dialect.now
        for row in rows:
            waiting = self.db.rows(
                "SELECT count(*) FROM webhook_deliveries WHERE tenant = ? AND endpoint = ?"
                " AND state IN ('pending', 'sending')",
                (row["tenant"], row["endpoint"]),
            )[0][0]
            state, log = "pending", []
            if waiting >= cap:
                state = "dropped"
                log = [{"error": f"{waiting} deliveries were waiting for this endpoint already"}]
            self.db.rows(
                "INSERT INTO webhook_deliveries (id, event_id, type, tenant, endpoint,"
                " session_id, body, state, due_at, created_at, log, replay_of)"
                f" VALUES (?, ?, ?, ?, ?, ?, ?, ?, {now}, {now}, ?, ?)",
                (row["id"], row["event_id"], row["type"], row["tenant"], row["endpoint"],
                 row["session_id"], row["body"], state, json.dumps(log), row.get("replay_of")),
            )  # fmt: skip

    async def claim_deliveries(self, owner: str, limit: int, lease: float) -> list[dict[str, Any]]:
        """Take up to ``limit`` due deliveries for ``owner`` for ``lease`` seconds: the oldest
        due row of each endpoint with no attempt in flight, oldest first; each claim counts an
        attempt."""
        now = self.db.dialect.now
        rows = await self.db.select(
            "UPDATE webhook_deliveries SET state = 'sending', claimed_by = ?,"
            f" claimed_until = {now} + ?, attempts = attempts + 1"
            " WHERE seq IN (SELECT seq FROM (SELECT d.seq, ROW_NUMBER() OVER"
            " (PARTITION BY d.tenant, d.endpoint ORDER BY d.seq) AS place"
            f" FROM webhook_deliveries d WHERE {DUE.format(d='d.', now=now)}"
            f" AND {FIRST_IN_LINE} AND {IDLE.format(now=now)}) AS firsts"
            " WHERE place = 1 ORDER BY seq LIMIT ?)"
            f" AND {DUE.format(d='', now=now)} RETURNING {COLUMNS}",
            (owner, lease, limit),
        )
        return sorted((_row(r) for r in rows), key=lambda doc: doc["seq"])

    async def finish_attempt(
        self, delivery_id: str, attempt: dict[str, Any], state: str, retry_in: float
    ) -> None:
        """Record an attempt; the delivery is now ``state`` (pending: due in ``retry_in`` s)."""
        now = self.db.dialect.now

        def finish() -> None:
            found = self.db.rows("SELECT log FROM webhook_deliveries WHERE id = ?", (delivery_id,))
            log = [*json.loads(found[0]["log"]), attempt] if found else [attempt]
            self.db.rows(
                f"UPDATE webhook_deliveries SET state = ?, log = ?, due_at = {now} + ?,"
                " claimed_by = NULL, claimed_until = NULL,"
                f" finished_at = CASE WHEN ? THEN {now} END WHERE id = ?",
                (state, json.dumps(log), retry_in, state != "pending", delivery_id),
            )

        await self.db.run(finish)

    async def release_deliveries(self, owner: str) -> int:
        """At start: what ``owner`` was sending when it stopped is due again at once."""
        rows = await self.db.select(
            "UPDATE webhook_deliveries SET state = 'pending', claimed_by = NULL,"
            " claimed_until = NULL WHERE state = 'sending' AND claimed_by = ? RETURNING id",
            (owner,),
        )
        return len(rows)

    async def deliveries(
        self, tenant: str | None, state: str | None, before: int | None, limit: int
    ) -> list[dict[str, Any]]:
        """A page of deliveries, newest first: of one tenant (None: all), in one state (None:
        any), older than the ``seq`` ``before``."""
        where, params = [], []
        for clause, value in (("tenant = ?", tenant), ("state = ?", state), ("seq < ?", before)):
            if value is not None:
                where.append(clause)
                params.append(value)
        sql = f"SELECT {COLUMNS} FROM webhook_deliveries"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = await self.db.select(sql + " ORDER BY seq DESC LIMIT ?", (*params, limit))
        return [_row(r) for r in rows]

    async def get_delivery(self, delivery_id: str) -> dict[str, Any] | None:
        rows = await self.db.select(
            f"SELECT {COLUMNS} FROM webhook_deliveries WHERE id = ?", (delivery_id,)
        )
        return _row(rows[0]) if rows else None

    async def prune_deliveries(self, age: float) -> int:
        """Forget finished deliveries older than ``age`` seconds; how many."""
        rows = await self.db.select(
            f"DELETE FROM webhook_deliveries WHERE created_at < {self.db.dialect.now} - ?"
            " AND state NOT IN ('pending', 'sending') RETURNING seq",
            (age,),
        )
        return len(rows)
