"""Tenants' templates: one row per build, a version of its name; they outlive sessions.

A tag (``template_tags``) names one version of a tenant's template: moved to
another in one transaction, gone with the version it names.
"""

from __future__ import annotations

import json
from typing import Any

from .database import Repository


class Templates(Repository):
    """The ``templates`` table."""

    async def save_template(self, doc: dict[str, Any]) -> None:
        """Insert a build's record, or update its status and document."""
        await self.db.select(
            "INSERT INTO templates (id, tenant, name, version, status, created_at, doc)"
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE"
            " SET status = excluded.status, doc = excluded.doc",
            (doc["id"], doc["tenant"], doc["name"], doc["version"], doc["status"],
             doc["created_at"], json.dumps(doc)),
        )  # fmt: skip

    async def template_versions(self, tenant: str, name: str) -> list[dict[str, Any]]:
        """Every build of a tenant's template, newest first."""
        rows = await self.db.select(
            "SELECT doc FROM templates WHERE tenant = ? AND name = ? ORDER BY version DESC",
            (tenant, name),
        )
        return [json.loads(r["doc"]) for r in rows]

    async def templates_of_tenant(self, tenant: str) -> list[dict[str, Any]]:
        rows = await self.db.select(
            "SELECT doc FROM templates WHERE tenant = ? ORDER BY name, version DESC", (tenant,)
        )
        return [json.loads(r["doc"]) for r in rows]

    async def templates_in_status(self, status: str) -> list[dict[str, Any]]:
        """Every tenant's builds in one status (builds a restart cut short, images to remove)."""
        rows = await self.db.select("SELECT doc FROM templates WHERE status = ?", (status,))
        return [json.loads(r["doc"]) for r in rows]

    async def delete_template_version(self, build_id: str) -> None:
        await self.db.run(self._delete_version, build_id)

    def _delete_version(self, build_id: str) -> None:
        self.db.rows("DELETE FROM template_tags WHERE build = ?", (build_id,))
        self.db.rows("DELETE FROM templates WHERE id = ?", (build_id,))

    async def tag_template(
        self, build_id: str, tenant: str, name: str, tags: list[str], at: float, cap: int
    ) -> str | None:
        """Point ``tags`` at a ready build of the tenant's template, all or none.

        None when done; "gone" when the build is not (or no longer) a ready one
        of that template; "full" when the template would hold more than ``cap`` tags.
        """
        return await self.db.run(self._tag, build_id, tenant, name, tags, at, cap)

    def _tag(
        self, build_id: str, tenant: str, name: str, tags: list[str], at: float, cap: int
    ) -> str | None:
        db = self.db
        if db.dialect.claims_lock:  # gateways sharing the database count each other's tags
            db.rows(db.dialect.claims_lock)
        if not db.rows(
            "SELECT 1 FROM templates WHERE id = ? AND tenant = ? AND name = ? AND status = 'ready'",
            (build_id, tenant, name),
        ):
            return "gone"
        held = {r[0] for r in db.rows(
            "SELECT tag FROM template_tags WHERE tenant = ? AND name = ?", (tenant, name)
        )}  # fmt: skip
        if len(held | set(tags)) > cap:
            return "full"
        db.cursor_many(
            "INSERT INTO template_tags (tenant, name, tag, build, created_at)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, name, tag) DO UPDATE"
            " SET build = excluded.build, created_at = excluded.created_at",
            [(tenant, name, tag, build_id, at) for tag in tags],
        )
        return None

    async def untag_template(self, tenant: str, name: str, tags: list[str] | None) -> int:
        """Remove some of a template's tags (None: all); how many there were."""
        return await self.db.run(self._untag, tenant, name, tags)

    def _untag(self, tenant: str, name: str, tags: list[str] | None) -> int:
        sql = "DELETE FROM template_tags WHERE tenant = ? AND name = ?"
        if tags is None:
            return self.db.cursor(sql, (tenant, name)).rowcount
        return sum(self.db.cursor(f"{sql} AND tag = ?", (tenant, name, t)).rowcount for t in tags)

    async def template_tags(self, tenant: str, name: str | None) -> list[dict[str, Any]]:
        """A tenant's tags (of one template, or all): tag, name, build, created_at, by tag."""
        where, params = (
            ("tenant = ? AND name = ?", (tenant, name)) if name else ("tenant = ?", (tenant,))
        )
        rows = await self.db.select(
            f"SELECT tag, name, build, created_at FROM template_tags WHERE {where}"
            " ORDER BY name, tag",
            params,
        )
        return [{"tag": r[0], "name": r[1], "build": r[2], "created_at": float(r[3])} for r in rows]

    async def set_template_pool(self, tenant: str, name: str, size: int) -> None:
        """Record how many ready sandboxes a tenant's template keeps (0: none, forgotten)."""
        if not size:
            sql, params = "DELETE FROM template_pools WHERE tenant = ? AND name = ?", (tenant, name)
        else:
            sql, params = (
                "INSERT INTO template_pools (tenant, name, size) VALUES (?, ?, ?)"
                " ON CONFLICT (tenant, name) DO UPDATE SET size = excluded.size",
                (tenant, name, size),
            )
        await self.db.select(sql, params)

    async def template_pools(self) -> list[dict[str, Any]]:
        """Every tenant's templates' pools: tenant, name, size."""
        rows = await self.db.select("SELECT tenant, name, size FROM template_pools")
        return [{"tenant": r[0], "name": r[1], "size": int(r[2])} for r in rows]
