"""Tenants' quotas and hosts' caps, counted once for a whole deployment: one claim per session.

Every create claims its share (a session, its memory, CPUs and disk) before
anything starts; the claim is checked against everything the tenant holds and
added in one call on the store's thread, under a lock every gateway sharing the
database takes (``Dialect.claims_lock``), so concurrent creates through any
number of gateways never pass a quota.

A claim counts while it is fresh (``expires_at``, extended while its create
is in flight) or while its session is open; a session's end releases it. A
gateway that dies mid-create stops extending its claims, and they stop
counting a lease's time later. A session whose gateway died where no other
can adopt it (another host) stays open, and counts, until its lease has run
out ``ORPHANED`` seconds ago: a host that never comes back does not hold its
tenants' quotas for ever. Released claims are kept a minute: they are the
creates per minute.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .database import Repository

WINDOW = 60.0  # seconds: creates are counted per minute
RELEASE = "UPDATE claims SET released_at = {now} WHERE session_id = ? AND released_at IS NULL"
ORPHANED = 300.0  # seconds after its lease ran out that nobody's open session stops counting
HELD = (
    "released_at IS NULL AND (expires_at >= {now} OR EXISTS"
    " (SELECT 1 FROM sessions WHERE id = claims.session_id AND ended_at IS NULL)"
    " AND NOT EXISTS (SELECT 1 FROM leases WHERE session_id = claims.session_id"
    f" AND expires_at < {{now}} - {ORPHANED:g}))"
)

# A tenant's volumes' sizes (store/volumes.py): they count toward its disk quota too.
VOLUME_BYTES = "(SELECT coalesce(sum(size_bytes), 0) FROM volumes WHERE tenant = ?)"


class Claims(Repository):
    """The ``claims`` table."""

    @property
    def held(self) -> str:
        return HELD.format(now=self.db.dialect.now)

    async def claim_quota(
        self, claim: dict[str, Any], caps: dict[str, float], ttl: float
    ) -> dict[str, Any] | None:
        """Claim ``claim``'s share of its tenant's quota (``caps``) unless that would pass it.

        ``claim``: session_id, tenant, owner, host, memory, cpus, disk. ``caps``:
        sessions, memory, cpus, disk, per_minute, and the host's: host_sessions,
        host_memory (each 0: none). None when granted; else what would pass
        its cap: {what, used, cap, wanted}.
        """
        return await self.db.run(self._claim, claim, caps, ttl)

    def _claim(
        self, claim: dict[str, Any], caps: dict[str, float], ttl: float
    ) -> dict[str, Any] | None:
        db, now, tenant = self.db, self.db.dialect.now, claim["tenant"]
        if db.dialect.claims_lock:
            db.rows(db.dialect.claims_lock)
        db.rows(
            f"DELETE FROM claims WHERE tenant = ? AND claimed_at < {now} - ? AND NOT ({self.held})",
            (tenant, WINDOW),
        )
        used = self._held("tenant", tenant)
        used["disk"] += int(db.rows(f"SELECT {VOLUME_BYTES}", (tenant,))[0][0])
        wanted = {"sessions": 1, "memory": claim["memory"], "cpus": claim["cpus"],
                  "disk": claim["disk"]}  # fmt: skip
        if caps.get("per_minute"):
            recent = db.rows(
                f"SELECT count(*) FROM claims WHERE tenant = ? AND claimed_at >= {now} - ?",
                (tenant, WINDOW),
            )
            used["per_minute"], wanted["per_minute"] = int(recent[0][0]), 1
        if caps.get("host_sessions") or caps.get("host_memory"):  # 0: that cap is off
            host = self._held("host", claim["host"])
            for what, amount in (("sessions", 1), ("memory", claim["memory"])):
                if caps.get(f"host_{what}"):
                    used[f"host_{what}"], wanted[f"host_{what}"] = host[what], amount
        for what, amount in wanted.items():
            if used[what] + amount > caps[what]:
                return {"what": what, "used": used[what], "cap": caps[what], "wanted": amount}
        taken = db.rows(
            "INSERT INTO claims (session_id, tenant, owner, host, memory, cpus, disk, claimed_at,"
            f" expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, {now}, {now} + ?)"
            " ON CONFLICT (session_id) DO NOTHING RETURNING session_id",
            (claim["session_id"], tenant, claim["owner"], claim.get("host", ""), claim["memory"],
             claim["cpus"], claim["disk"], ttl),
        )  # fmt: skip
        return None if taken else {"what": "id", "used": 0, "cap": 0, "wanted": 1}

    def _held(self, column: str, value: str) -> dict[str, float]:
        """What the claims that count of a tenant (or a host) add up to."""
        row = self.db.rows(
            "SELECT count(*), coalesce(sum(memory), 0), coalesce(sum(cpus), 0),"
            f" coalesce(sum(disk), 0) FROM claims WHERE {column} = ? AND {self.held}",
            (value,),
        )[0]
        return {
            "sessions": int(row[0]),
            "memory": int(row[1]),
            "cpus": float(row[2]),
            "disk": int(row[3]),
        }  # fmt: skip (PostgreSQL sums bigints as numerics)

    async def extend_claims(self, session_ids: list[str], ttl: float) -> None:
        """Keep in-flight creates' claims fresh for another ``ttl`` seconds."""
        now = self.db.dialect.now
        marks = ", ".join("?" * len(session_ids))
        await self.db.select(
            f"UPDATE claims SET expires_at = {now} + ? WHERE session_id IN ({marks})"
            " AND released_at IS NULL",
            (ttl, *session_ids),
        )

    def rebind_claim(self, session_id: str, new_id: str) -> asyncio.Future:
        """The claim made under ``session_id`` is now ``new_id``'s (a warm sandbox's id)."""
        return self.db.submit(
            self.db.rows, "UPDATE claims SET session_id = ? WHERE session_id = ?",
            (new_id, session_id), quick=True,
        )  # fmt: skip

    async def release_claim(self, session_id: str) -> None:
        """Forget the claim of a create that never started: it holds nothing, and it was no
        create either (a refused one does not use up the creates per minute)."""
        await self.db.select("DELETE FROM claims WHERE session_id = ?", (session_id,))

    async def release_stale_claims(self, owner: str) -> int:
        """At start: ``owner``'s claims whose session is not open were in flight when it
        stopped; nothing of them is in flight now."""
        rows = await self.db.select(
            f"UPDATE claims SET released_at = {self.db.dialect.now} WHERE owner = ?"
            " AND released_at IS NULL AND NOT EXISTS"
            " (SELECT 1 FROM sessions WHERE id = claims.session_id AND ended_at IS NULL)"
            " RETURNING session_id",
            (owner,),
        )
        return len(rows)
