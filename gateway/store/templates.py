"""Tenants' templates: one row per build, a version of its name; they outlive sessions."""

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
        await self.db.select("DELETE FROM templates WHERE id = ?", (build_id,))
