"""E2B's ``Volume`` control API (``/volumes``) over the tenant's named volumes (``/v1/volumes``).

A volume's id is the gateway's; its name is the tenant's, in the gateway's
grammar. Its files are reached by the SDK's own file methods, with the
per-volume token handed back here (``volume_content.py``), through
``/v1/volumes/{name}/files``, or by mounting it (``Sandbox.create(volume_mounts=...)``).
"""

from __future__ import annotations

from typing import Any

from ...sessions.requests import CreateVolume
from ..volumes import delete_volume
from .control import ControlHandler

_VOLUME = r"(?P<volume_id>[^/]+)"


def volume_info(handler: ControlHandler, doc: dict[str, Any]) -> dict[str, Any]:
    """A volume as E2B's ``VolumeAndToken``: its token is the caller's, for its files only."""
    token = handler.credentials.volumes.issue(doc["id"], handler.principal.token_id)
    return {"volumeID": doc["id"], "name": doc["name"], "token": token}


class VolumesHandler(ControlHandler):
    """``Volume.list`` and ``Volume.create``."""

    actions = {"POST": "volume.create"}

    async def get(self) -> None:
        docs = self.page(await self.volumes.list(self.principal))
        self.send([{"volumeID": d["id"], "name": d["name"]} for d in docs])

    async def post(self) -> None:
        request = CreateVolume.from_json({"name": self.json_body().get("name")})
        self.audit_detail["name"] = request.name
        doc = await self.volumes.create(self.principal, request)  # the server's default size
        self.audit_detail["volume_id"] = doc["id"]
        self.send(volume_info(self, doc), status=201)


class VolumeHandler(ControlHandler):
    """``Volume.get_info`` (and ``connect``) and ``Volume.destroy``."""

    actions = {"DELETE": "volume.delete"}

    async def get(self, volume_id: str) -> None:
        self.send(volume_info(self, await self.volumes.get(self.principal, volume_id)))

    async def delete(self, volume_id: str) -> None:
        await delete_volume(self, volume_id)


routes = [(r"/volumes", VolumesHandler), (rf"/volumes/{_VOLUME}", VolumeHandler)]
