"""E2B's volume content API (``/volumecontent/{id}/...``): a ``Volume``'s own file methods.

``list``, ``make_dir``, ``get_info`` / ``exists``, ``update_metadata``,
``read_file``, ``write_file`` and ``remove`` reach the volume's files
through the same domain calls as ``/v1/volumes/{name}/files``: the
workspace path rules (rooted at the volume: ``/a/b`` is ``a/b``), the
tenant's file rules, the volume's cap (an upload past it is a 413 and
leaves nothing). The caller sends the volume's own token
(``access/volume_tokens.py``; the edge checks it before a body is read) or
its tenant's API key. A volume's files belong to the sandbox user with the
modes the gateway gives them: metadata that asks for others is a 400.
"""

from __future__ import annotations

from typing import Any

import tornado.web

from ...access.auth import Principal
from ...errors import BadRequest, Conflict, Unauthorized
from ...workspace.files import AsyncWorkspace
from ..files import StreamedUpload, open_upload, send_file
from .base import E2BHandler, volume_token

_CONTENT = r"/volumecontent/(?P<volume_id>[^/]+)"
_MODES = {"directory": 0o755, "file": 0o644, "symlink": 0o777}


def volume_path(path: str) -> str:
    """A content API path (rooted at the volume, ``/`` its root) as a workspace path."""
    return path.lstrip("/")


class ContentHandler(E2BHandler):
    """Authenticated by the volume's token (or the tenant's API key); its files, by id."""

    def authenticate(self) -> Principal:
        volume_id = self.path_kwargs["volume_id"]
        owner = self.credentials.volume_holder(volume_id, volume_token(self.request.headers))
        if owner is not None:
            self.principal = Principal(
                tenant=owner.tenant, token_id=f"volume:{volume_id[:8]}", acting_for=owner.token_id
            )
            return self.principal
        try:
            return super().authenticate()  # the tenant's API key
        except Unauthorized:
            raise Unauthorized(
                "the volume token is missing or not this volume's: send the token that "
                "Volume.create or Volume.connect handed out (or the tenant's API key)"
            ) from None

    @property
    def path(self) -> str:
        return volume_path(self.get_argument("path", ""))

    async def files(self) -> AsyncWorkspace:
        self.audit_detail.update(volume_id=self.path_kwargs["volume_id"], path=self.path)
        return await self.volumes.files_with_id(self.principal, self.path_kwargs["volume_id"])

    async def entry(self, files: AsyncWorkspace, path: str) -> dict[str, Any]:
        return self.entry_stat(await files.stat(path))

    def entry_stat(self, entry: dict[str, Any]) -> dict[str, Any]:
        """A workspace entry as E2B's ``VolumeEntryStat``."""
        kind, when = entry["type"], entry["modified"]
        uid, gid = self.volumes.options.owner
        return {"name": entry["name"] or "/", "type": kind if kind in _MODES else "unknown",
                "path": "/" + entry["path"], "size": entry["size"] or 0,
                "mode": _MODES.get(kind, 0), "uid": uid, "gid": gid,
                "atime": when, "mtime": when, "ctime": when}  # fmt: skip

    def check_metadata(self, kind: str, asked: dict[str, Any]) -> None:
        """Refuse an owner or mode other than the ones the gateway gives a ``kind``."""
        uid, gid = self.volumes.options.owner
        given = {"uid": uid, "gid": gid, "mode": _MODES[kind]}
        if any(value is not None and str(value) != str(given[k]) for k, value in asked.items()):
            raise BadRequest(
                f"a volume's files belong to the sandbox user (uid {uid}, gid {gid}), a {kind} "
                f"with mode {given['mode']:o}: leave uid, gid and mode out"
            )

    def asked(self) -> dict[str, Any]:
        return {k: self.get_argument(k, None) for k in ("uid", "gid", "mode")}


class DirHandler(ContentHandler):
    """``Volume.list(path, depth)`` (GET) and ``make_dir`` (POST; ``force``: its parents too)."""

    actions = {"POST": "volume.make_dir"}

    async def get(self, volume_id: str) -> None:
        files = await self.files()
        if (await files.stat(self.path))["type"] != "directory":
            raise BadRequest(f"{self.get_argument('path', '')!r} is not a directory")
        tree = await files.tree(self.path, max(1, self.int_argument("depth", 1)))
        self.send([self.entry_stat(e) for e in tree["entries"]])

    async def post(self, volume_id: str) -> None:
        self.check_metadata("directory", self.asked())
        files, path = await self.files(), self.path
        parent = path.rstrip("/").rpartition("/")[0]
        if self.get_argument("force", "false").lower() != "true" and parent:
            await files.stat(parent)  # 404 without it, unless asked to make parents
        await files.make_dir(path)
        entry = await self.entry(files, path)
        if entry["type"] != "directory":
            raise Conflict(f"{entry['path']!r} is a {entry['type']}, not a directory")
        self.send(entry, status=201)


class PathHandler(ContentHandler):
    """``get_info`` / ``exists`` (GET), ``update_metadata`` (PATCH), ``remove`` (DELETE)."""

    actions = {"PATCH": "volume.update_metadata", "DELETE": "volume.delete_file"}

    async def get(self, volume_id: str) -> None:
        self.send(await self.entry(await self.files(), self.path))

    async def patch(self, volume_id: str) -> None:
        body = self.json_body()
        files = await self.files()
        entry = await self.entry(files, self.path)
        self.check_metadata(entry["type"], {k: body.get(k) for k in ("uid", "gid", "mode")})
        self.send(entry)

    async def delete(self, volume_id: str) -> None:
        files = await self.files()
        self.volumes.check_file(self.principal, "delete")
        await files.remove(self.path)
        self.set_status(204)
        self.finish()


@tornado.web.stream_request_body
class FileHandler(StreamedUpload, ContentHandler):
    """``read_file`` (GET, streamed) and ``write_file`` (PUT, streamed; a 413 past the cap)."""

    actions = {"PUT": "volume.upload", "GET": "volume.download"}
    forwards = False

    async def start_upload(self) -> None:
        self.check_metadata("file", self.asked())
        files = await self.files()
        self.check_upload(int(self.request.headers.get("Content-Length", 0) or 0))
        self.upload = await open_upload(self.request, files, self.path)

    def check_upload(self, size: int) -> None:
        self.volumes.check_file(self.principal, "upload", size)

    async def put(self, volume_id: str) -> None:
        self.answer_refusal()
        upload = await self.finish_upload()
        self.audit_detail.update(size=upload.size, sha256=upload.sha256)
        self.send(await self.entry(await self.files(), self.path), status=201)

    async def get(self, volume_id: str) -> None:
        self.answer_refusal()
        files = await self.files()
        check = lambda size: self.volumes.check_file(self.principal, "download", size)  # noqa: E731
        await send_file(self, files, self.path, check)


routes = [
    (rf"{_CONTENT}/dir", DirHandler),
    (rf"{_CONTENT}/path", PathHandler),
    (rf"{_CONTENT}/file", FileHandler),
]
