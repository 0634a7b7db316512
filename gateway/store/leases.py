"""Which gateway owns each open session, until when, and where each gateway answers.

Expiry is read on the database's clock (``Dialect.now``), never a gateway's:
gateways sharing a server need not agree on the time.
"""

from __future__ import annotations

from .database import Repository


class Leases(Repository):
    """The ``leases`` and ``gateways`` tables."""

    @property
    def now(self) -> str:
        """The database's clock, in seconds (an SQL expression)."""
        return self.db.dialect.now

    async def unheld(self, session_id: str) -> bool:
        """Whether an open session's lease ran out: its owner is gone, another adopts it soon."""
        rows = await self.db.select(
            "SELECT 1 FROM leases JOIN sessions ON id = session_id"
            f" WHERE session_id = ? AND ended_at IS NULL AND expires_at < {self.now}",
            (session_id,),
        )
        return bool(rows)

    async def owned_elsewhere(self, owner: str) -> set[str]:
        """Open sessions another gateway holds or held a lease on: never ``owner``'s to reap."""
        rows = await self.db.select(
            "SELECT session_id FROM leases JOIN sessions ON id = session_id"
            " WHERE ended_at IS NULL AND owner <> ?",
            (owner,),
        )
        return {row[0] for row in rows}

    async def claim_lease(self, session_id: str, owner: str, ttl: float) -> bool:
        """Own a session for ``ttl`` seconds unless another owner's lease still runs.

        One statement, so two gateways claiming at once cannot both win: the
        database serialises them on the lease's row and the second sees the first.
        """
        rows = await self.db.select(
            "INSERT INTO leases (session_id, owner, expires_at, renewed_at)"
            f" VALUES (?, ?, {self.now} + ?, {self.now}) ON CONFLICT (session_id) DO UPDATE"
            " SET owner = excluded.owner, expires_at = excluded.expires_at,"
            " renewed_at = excluded.renewed_at"
            f" WHERE leases.owner = excluded.owner OR leases.expires_at < {self.now}"
            " RETURNING owner",
            (session_id, owner, ttl),
        )
        return bool(rows)

    async def renew_leases(self, owner: str, ttl: float) -> set[str]:
        """Extend every lease ``owner`` still holds; the sessions whose lease was extended.

        A lease that ran out is not extended, even if nobody took it yet:
        another gateway may be adopting its session right now.
        """
        rows = await self.db.select(
            f"UPDATE leases SET expires_at = {self.now} + ?, renewed_at = {self.now}"
            f" WHERE owner = ? AND expires_at >= {self.now} RETURNING session_id",
            (ttl, owner),
        )
        return {row[0] for row in rows}

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Give up a session's lease, if ``owner`` holds it (an ended session's)."""
        await self.db.select(
            "DELETE FROM leases WHERE session_id = ? AND owner = ?", (session_id, owner)
        )

    async def announce(self, gateway_id: str, address: str) -> None:
        """Record where a gateway answers (its base URL), for requests others pass on."""
        await self.db.select(
            f"INSERT INTO gateways (id, address, seen_at) VALUES (?, ?, {self.now})"
            " ON CONFLICT (id) DO UPDATE"
            " SET address = excluded.address, seen_at = excluded.seen_at",
            (gateway_id, address),
        )

    async def owner_address(self, session_id: str) -> tuple[str, str] | None:
        """The gateway holding a running lease on the session, and where it answers."""
        rows = await self.db.select(
            "SELECT owner, address FROM leases JOIN gateways ON gateways.id = owner"
            f" WHERE session_id = ? AND expires_at >= {self.now}",
            (session_id,),
        )
        return (rows[0][0], rows[0][1]) if rows else None
