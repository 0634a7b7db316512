"""E2B's ``Secret`` API (``/secrets``) over the tenant's sealed secrets (``/v1/secrets``).

Values are write-only here as there. A secret's id is its name; its version
is not counted (always 1) and metadata is not stored, so create or update
with metadata is a 400 rather than a silent loss. Names are the gateway's
(letters, digits and ``_``: they become environment variables).
"""

from __future__ import annotations

from typing import Any

from ...errors import BadRequest, NotFound
from ..secrets import delete_secret
from .control import ControlHandler

_SECRET = r"(?P<secret>[^/]+)"


def secret_info(stored: dict[str, str]) -> dict[str, Any]:
    """A stored secret's name and dates as E2B's ``Secret``."""
    return {
        "secretID": stored["name"],
        "name": stored["name"],
        "currentVersion": 1,
        "metadata": {},
        "createdAt": stored["created_at"],
        "updatedAt": stored["updated_at"],
    }


def _value(body: dict[str, Any]) -> Any:
    if body.get("metadata"):
        raise BadRequest("secret metadata is not stored by this gateway; leave it out")
    return body.get("value")


class SecretsHandler(ControlHandler):
    """``Secret.list`` and ``Secret.create``."""

    actions = {"POST": "secret.create"}

    async def get(self) -> None:
        self.send([secret_info(s) for s in self.page(await self.secrets.list(self.principal))])

    async def post(self) -> None:
        body = self.json_body()
        self.audit_detail["name"] = body.get("name")
        stored, _ = await self.secrets.put(
            self.principal, body.get("name"), _value(body), overwrite=False
        )
        self.send(secret_info(stored), status=201)


class SecretHandler(ControlHandler):
    """``Secret.get_info`` (and ``exists``), ``Secret.update`` and ``Secret.destroy``."""

    actions = {"POST": "secret.rotate", "DELETE": "secret.delete"}

    async def _find(self, name: str) -> dict[str, str]:
        found = next(
            (s for s in await self.secrets.list(self.principal) if s["name"] == name), None
        )
        if found is None:
            raise NotFound(f"tenant {self.principal.tenant!r} has no secret {name!r}")
        return found

    async def get(self, secret: str) -> None:
        self.send(secret_info(await self._find(secret)))

    async def post(self, secret: str) -> None:
        self.audit_detail["name"] = secret
        await self._find(secret)  # an update names a secret that exists
        stored, _ = await self.secrets.put(
            self.principal, secret, _value(self.json_body()), overwrite=True
        )
        self.send(secret_info(stored))

    async def delete(self, secret: str) -> None:
        await delete_secret(self, secret)


routes = [(r"/secrets", SecretsHandler), (rf"/secrets/{_SECRET}", SecretHandler)]
