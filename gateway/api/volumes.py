"""Named volumes: ``/v1/volumes`` (create, list, inspect, delete) and their files, no session.

Files go through the same path rules and streamed transfers as a session's
(``api/files.py``), and the tenant's policy file rules.
"""

from __future__ import annotations

import tornado.web

from ..sessions.requests import CreateVolume
from ..sessions.volumes import public
from .base import JSONHandler
from .files import StreamedUpload, open_upload, send_file

_NAME = r"(?P<name>[^/]+)"


class VolumesHandler(JSONHandler):
    actions = {"POST": "volume.create"}

    async def get(self) -> None:
        self.send({"volumes": [public(doc) for doc in await self.volumes.list(self.principal)]})

    async def post(self) -> None:
        request = CreateVolume.from_json(self.json_body())
        self.audit_detail["name"] = request.name
        doc = await self.volumes.create(self.principal, request)
        self.audit_detail.update(volume_id=doc["id"], size_bytes=doc["size_bytes"])
        self.set_header("Location", f"/v1/volumes/{doc['name']}")
        self.send(public(doc), status=201)


class VolumeHandler(JSONHandler):
    actions = {"DELETE": "volume.delete"}

    async def get(self, name: str) -> None:
        self.send(await self.volumes.inspect(self.principal, name))

    async def delete(self, name: str) -> None:
        await delete_volume(self, name)


async def delete_volume(handler: JSONHandler, name: str) -> None:
    """Delete the caller's tenant's volume (by name or id) and answer 204 (``/v1`` and E2B's)."""
    handler.audit_detail["name"] = name
    doc = await handler.volumes.delete(handler.principal, name)
    handler.audit_detail["volume_id"] = doc["id"]
    handler.set_status(204)
    handler.finish()


class VolumeFilesHandler(JSONHandler):
    """``GET ?path=dir``: a directory of the volume (bounded, as a workspace's listing)."""

    async def get(self, name: str) -> None:
        files = await self.volumes.files(self.principal, name)
        path = self.get_argument("path", "")
        self.send({"path": path, **await files.list(path)})


@tornado.web.stream_request_body
class VolumeFileHandler(StreamedUpload, JSONHandler):
    """One file of a volume: ``PUT`` (streamed; ENOSPC past its size), ``GET``, ``DELETE``."""

    actions = {"PUT": "volume.upload", "GET": "volume.download", "DELETE": "volume.delete_file"}
    forwards = False

    async def start_upload(self) -> None:
        files = await self.volumes.files(self.principal, self.path_kwargs["name"])
        self.check_upload(int(self.request.headers.get("Content-Length", 0) or 0))
        self.upload = await open_upload(self.request, files, self.path_kwargs["path"])

    def check_upload(self, size: int) -> None:
        self.volumes.check_file(self.principal, "upload", size)

    async def put(self, name: str, path: str) -> None:
        self.answer_refusal()
        upload = await self.finish_upload()
        saved = {"volume": name, "path": path, "size": upload.size, "sha256": upload.sha256}
        self.audit_detail.update(saved)
        self.send(saved, status=201)

    async def get(self, name: str, path: str) -> None:
        self.answer_refusal()
        self.audit_detail.update(volume=name, path=path)
        files = await self.volumes.files(self.principal, name)
        await send_file(
            self,
            files,
            path,
            lambda size: self.volumes.check_file(self.principal, "download", size),
        )

    async def delete(self, name: str, path: str) -> None:
        self.answer_refusal()
        self.audit_detail.update(volume=name, path=path)
        files = await self.volumes.files(self.principal, name)
        self.volumes.check_file(self.principal, "delete")
        await files.remove(path)
        self.set_status(204)
        self.finish()


routes = [
    (r"/v1/volumes", VolumesHandler),
    (rf"/v1/volumes/{_NAME}", VolumeHandler),
    (rf"/v1/volumes/{_NAME}/files", VolumeFilesHandler),
    (rf"/v1/volumes/{_NAME}/files/(?P<path>.+)", VolumeFileHandler),
]
