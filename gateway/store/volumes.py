"""Tenants' named volumes and which sessions mount them, decided under the claims lock.

A volume's size counts toward its tenant's disk quota beside its sessions'
workspaces (``claims.py`` adds them up), so a volume is created, and a mount
taken, on the store's thread under the lock every gateway sharing the
database takes for a quota claim: two creates never both fit in the last
gigabyte, two writers never both mount one volume. A mount holds while its
session's claim does (open, paused, or a create in flight), so a session that
ends, or a create that never started, frees its volumes with its claim.
"""

from __future__ import annotations

import json
from typing import Any

from .claims import HELD, VOLUME_BYTES
from .database import Repository

MOUNT_HELD = (
    "EXISTS (SELECT 1 FROM claims WHERE claims.session_id = volume_mounts.session_id AND {held})"
)


class Volumes(Repository):
    """The ``volumes`` and ``volume_mounts`` tables."""

    @property
    def _held(self) -> str:
        return MOUNT_HELD.format(held=HELD.format(now=self.db.dialect.now))

    def _lock(self) -> None:
        if self.db.dialect.claims_lock:
            self.db.rows(self.db.dialect.claims_lock)

    async def add_volume(self, doc: dict[str, Any], caps: dict[str, int]) -> dict[str, Any] | None:
        """Add ``doc`` (id, tenant, name, size_bytes, created_at) unless it passes ``caps``.

        ``caps``: volumes (how many a tenant keeps) and disk (its sessions' workspaces and
        volumes together). None when added; else {what: name | volumes | disk, used, cap}.
        """
        return await self.db.run(self._add, doc, caps)

    def _add(self, doc: dict[str, Any], caps: dict[str, int]) -> dict[str, Any] | None:
        db, tenant = self.db, doc["tenant"]
        self._lock()
        if db.rows("SELECT 1 FROM volumes WHERE tenant = ? AND name = ?", (tenant, doc["name"])):
            return {"what": "name", "used": 0, "cap": 0}
        count = int(db.rows("SELECT count(*) FROM volumes WHERE tenant = ?", (tenant,))[0][0])
        if count + 1 > caps["volumes"]:
            return {"what": "volumes", "used": count, "cap": caps["volumes"]}
        held = HELD.format(now=db.dialect.now)
        disk = int(
            db.rows(
                f"SELECT coalesce(sum(disk), 0) + {VOLUME_BYTES} FROM claims"
                f" WHERE tenant = ? AND {held}",
                (tenant, tenant),
            )[0][0]
        )
        if disk + doc["size_bytes"] > caps["disk"]:
            return {"what": "disk", "used": disk, "cap": caps["disk"]}
        db.rows(
            "INSERT INTO volumes (id, tenant, name, size_bytes, created_at, doc)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (doc["id"], tenant, doc["name"], doc["size_bytes"], doc["created_at"], json.dumps(doc)),
        )
        return None

    async def get_volume(self, tenant: str, ref: str) -> dict[str, Any] | None:
        """The tenant's volume named (or with the id) ``ref``; never another tenant's."""
        rows = await self.db.select(
            "SELECT doc FROM volumes WHERE tenant = ? AND (name = ? OR id = ?)"
            " ORDER BY CASE WHEN name = ? THEN 0 ELSE 1 END LIMIT 1",  # a name wins over an id
            (tenant, ref, ref, ref),
        )
        return json.loads(rows[0]["doc"]) if rows else None

    async def volumes_of_tenant(self, tenant: str) -> list[dict[str, Any]]:
        rows = await self.db.select(
            "SELECT doc FROM volumes WHERE tenant = ? ORDER BY name", (tenant,)
        )
        return [json.loads(r["doc"]) for r in rows]

    async def volume_ids(self) -> set[str]:
        """Every volume's id, any tenant's (a start sweeps filesystems none of them names)."""
        return {r["id"] for r in await self.db.select("SELECT id FROM volumes")}

    async def volume_holders(self, volume_id: str) -> list[dict[str, Any]]:
        """The sessions that hold a mount of the volume: {session_id, read_only}."""
        return await self.db.run(self._holders, volume_id)

    def _holders(self, volume_id: str) -> list[dict[str, Any]]:
        rows = self.db.rows(
            "SELECT session_id, read_only FROM volume_mounts WHERE volume_id = ?"
            f" AND {self._held} ORDER BY session_id",
            (volume_id,),
        )
        return [{"session_id": r[0], "read_only": bool(r[1])} for r in rows]

    async def delete_volume(self, volume_id: str) -> list[dict[str, Any]]:
        """Delete the volume's record unless a session holds it; those holders (none: deleted)."""
        return await self.db.run(self._delete, volume_id)

    def _delete(self, volume_id: str) -> list[dict[str, Any]]:
        self._lock()
        holders = self._holders(volume_id)
        if not holders:
            self.db.rows("DELETE FROM volume_mounts WHERE volume_id = ?", (volume_id,))
            self.db.rows("DELETE FROM volumes WHERE id = ?", (volume_id,))
        return holders

    async def mount_volumes(
        self, session_id: str, mounts: list[tuple[str, bool]]
    ) -> dict[str, Any] | None:
        """Take ``session_id``'s mounts, (volume id, read-only) each, all or none.

        Any number of read-only mounts share a volume, or one read-write mount
        holds it alone. None when taken; else the first conflict: {volume_id,
        holders} (the sessions in the way), with ``gone`` if the volume was deleted meanwhile.
        """
        return await self.db.run(self._mount, session_id, mounts)

    def _mount(self, session_id: str, mounts: list[tuple[str, bool]]) -> dict[str, Any] | None:
        self._lock()
        self.db.rows(f"DELETE FROM volume_mounts WHERE NOT {self._held}")  # ended sessions'
        for volume_id, read_only in mounts:
            if not self.db.rows("SELECT 1 FROM volumes WHERE id = ?", (volume_id,)):
                return {"volume_id": volume_id, "holders": [], "gone": True}  # deleted meanwhile
            holders = [h for h in self._holders(volume_id) if h["session_id"] != session_id]
            if holders and not (read_only and all(h["read_only"] for h in holders)):
                return {"volume_id": volume_id, "holders": holders}
        for volume_id, read_only in mounts:
            self.db.rows(
                "INSERT INTO volume_mounts (volume_id, session_id, read_only) VALUES (?, ?, ?)"
                " ON CONFLICT (volume_id, session_id) DO UPDATE SET read_only = ?",
                (volume_id, session_id, read_only, read_only),
            )
        return None
