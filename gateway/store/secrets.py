"""Tenants' sealed secrets: only ciphertext (``access.secrets`` holds the key)."""

from __future__ import annotations

from .database import Repository


class Secrets(Repository):
    """The ``secrets`` table."""

    async def put_secret(
        self, tenant: str, name: str, sealed: bytes, at: str, overwrite: bool
    ) -> tuple[dict[str, str], bool] | None:
        """Store a sealed value: (its dates, whether new); None if it exists, not to overwrite."""

        def put() -> tuple[dict[str, str], bool] | None:
            found = self.db.rows(
                "SELECT 1 FROM secrets WHERE tenant = ? AND name = ?", (tenant, name)
            )
            if found and not overwrite:
                return None
            self.db.rows(
                "INSERT INTO secrets (tenant, name, sealed, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, name) DO UPDATE"
                " SET sealed = excluded.sealed, updated_at = excluded.updated_at",
                (tenant, name, sealed, at, at),
            )
            row = self.db.rows(
                "SELECT name, created_at, updated_at FROM secrets WHERE tenant = ? AND name = ?",
                (tenant, name),
            )[0]
            return dict(row), not found

        return await self.db.run(put)

    async def delete_secret(self, tenant: str, name: str) -> bool:
        """Forget a secret; whether there was one."""

        def delete() -> bool:
            sql = "DELETE FROM secrets WHERE tenant = ? AND name = ?"
            return self.db.cursor(sql, (tenant, name)).rowcount > 0

        return await self.db.run(delete)

    async def secret_dates(self, tenant: str) -> list[dict[str, str]]:
        """A tenant's secrets by name with their dates; never their values."""
        rows = await self.db.select(
            "SELECT name, created_at, updated_at FROM secrets WHERE tenant = ? ORDER BY name",
            (tenant,),
        )
        return [dict(row) for row in rows]

    async def sealed_secrets(self, tenant: str, names: list[str]) -> dict[str, bytes]:
        """The sealed values of those of ``names`` the tenant holds."""
        marks = ", ".join("?" * len(names))
        rows = await self.db.select(
            f"SELECT name, sealed FROM secrets WHERE tenant = ? AND name IN ({marks})",
            (tenant, *names),
        )
        return {row["name"]: bytes(row["sealed"]) for row in rows}
