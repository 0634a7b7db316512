"""Sealed secrets: ``/v1/secrets``, write-only. Names and dates come back, values never."""

from __future__ import annotations

from .base import JSONHandler

_NAME = r"(?P<name>[^/]+)"


class SecretsHandler(JSONHandler):
    actions = {"POST": "secret.create"}

    async def get(self) -> None:
        self.send({"secrets": await self.secrets.list(self.principal)})

    async def post(self) -> None:
        body = self.json_body()
        self.audit_detail["name"] = body.get("name")
        stored, _ = await self.secrets.put(
            self.principal, body.get("name"), body.get("value"), overwrite=False
        )
        self.set_header("Location", f"/v1/secrets/{stored['name']}")
        self.send(stored, status=201)


class SecretHandler(JSONHandler):
    actions = {"PUT": "secret.rotate", "DELETE": "secret.delete"}

    async def put(self, name: str) -> None:
        self.audit_detail["name"] = name
        body = self.json_body()
        stored, created = await self.secrets.put(
            self.principal, name, body.get("value"), overwrite=True
        )
        self.send(stored, status=201 if created else 200)

    async def delete(self, name: str) -> None:
        await delete_secret(self, name)


async def delete_secret(handler: JSONHandler, name: str) -> None:
    """Delete the caller's tenant's secret ``name`` and answer 204 (``/v1`` and E2B's)."""
    handler.audit_detail["name"] = name
    await handler.secrets.delete(handler.principal, name)
    handler.set_status(204)
    handler.finish()


routes = [(r"/v1/secrets", SecretsHandler), (rf"/v1/secrets/{_NAME}", SecretHandler)]
