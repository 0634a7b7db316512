"""envd's HTTP side: ``/files`` (download and upload) and ``/health``.

Paths are the SDK's: ``/home/user/x``, ``~/x`` and ``x`` all name ``x`` in the
session's workspace, the directory the kernel starts in. Downloads stream a
chunk at a time; ``application/octet-stream`` uploads (the SDK's choice for
streams and file objects) stream to disk; multipart uploads (bytes and text,
several files at once) are read into memory up to ``MAX_BATCH``.
"""

from __future__ import annotations

from typing import Any

import tornado.web
from tornado import httputil

from ...errors import (
    BadRequest,
    Denied,
    FileTooLarge,
    Forbidden,
    NotFound,
    PathForbidden,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from ...workspace.files import AsyncWorkspace
from ..base import JSONHandler
from ..files import MAX_BATCH, StreamedUpload, open_upload, stream_file
from .base import FILES, Credentials, SandboxHandler
from .mcp import TOKEN_FILE
from .templates import HOME


def workspace_path(path: str) -> str:
    """An SDK path as a workspace path (``""``: the workspace itself)."""
    if path == "~" or path.startswith("~/"):
        path = HOME + path[1:]
    if not path.startswith("/"):
        return path
    for root in (HOME, "/workspace"):  # the SDK's home, and where the kernel sees it
        if path == root or path.startswith(root + "/"):
            return path[len(root) :].lstrip("/")
    raise PathForbidden(f"{path!r} is outside {HOME}, the sandbox's workspace, the one reachable")


def sdk_path(path: str) -> str:
    """A workspace path as the SDK shows it."""
    return f"{HOME}/{path}" if path else HOME


def written(path: str) -> dict[str, Any]:
    return {"name": path.rsplit("/", 1)[-1], "type": "file", "path": sdk_path(path)}


class HealthHandler(SandboxHandler):
    """is_running(): the sandbox answers while its session lives."""

    async def get(self) -> None:
        self.set_status(204)
        self.finish()


@tornado.web.stream_request_body
class FilesHandler(StreamedUpload, SandboxHandler):
    """``GET ?path=`` downloads; ``POST ?path=`` uploads one file (octet-stream) or several."""

    actions = {"POST": "files.upload"}
    upload_method = "POST"
    target = ""
    batch: bytearray | None = None

    def workspace(self) -> AsyncWorkspace:
        return self.workspaces.files(self.sandbox_id, self.principal)

    def check_upload(self, size: int) -> None:
        self.workspaces.check_file(self.sandbox_id, self.principal, "upload", size)

    async def start_upload(self) -> None:
        self.check_upload(int(self.request.headers.get("Content-Length", 0) or 0))
        kind = self.request.headers.get("Content-Type", "")
        if kind.startswith("multipart/form-data"):
            self.batch = bytearray()
            self.request.connection.set_max_body_size(MAX_BATCH)
            return
        if not kind.startswith("application/octet-stream"):
            raise UnsupportedMediaType(
                "send a file as application/octet-stream, or files as multipart/form-data"
            )
        if self.request.headers.get("Content-Encoding", "identity") != "identity":
            raise UnsupportedMediaType("compressed uploads are not offered: send it as it is")
        self.target = workspace_path(self.get_query_argument("path"))
        self.upload = await open_upload(self.request, self.workspace(), self.target)

    async def data_received(self, chunk: bytes) -> None:
        if self.batch is None:
            await super().data_received(chunk)
        elif len(self.batch) + len(chunk) > MAX_BATCH:
            self.batch = None
            self.refusal = self.refusal or PayloadTooLarge(
                f"a multipart upload may carry {MAX_BATCH} bytes; "
                "send large files one at a time (the SDK streams file objects)"
            )
        else:
            self.batch += chunk

    async def get(self) -> None:
        self.answer_refusal()
        path = self.get_query_argument("path")
        if path == TOKEN_FILE:
            return self._mcp_token()
        source, info = await self.workspace().open_read(workspace_path(path))
        try:  # the session's policy rules these as it rules /v1's
            self.workspaces.check_file(self.sandbox_id, self.principal, "download", info.st_size)
        except Denied:
            await source.aclose()
            raise
        self.set_header("Content-Length", str(info.st_size))
        self.set_header("Content-Type", "application/octet-stream")
        await stream_file(self, source)

    def _mcp_token(self) -> None:
        """The sandbox's MCP token for the caller (``get_mcp_token()`` after ``connect``)."""
        token = self.credentials.mcp_tokens.issue(self.sandbox_id, self.principal.acting_for or "")
        if token is None:
            raise NotFound(
                f"{TOKEN_FILE}: no MCP gateway runs in this sandbox; create it with mcp=..."
            )
        self.set_header("Content-Type", "application/octet-stream")
        self.set_header("Cache-Control", "no-store")
        self.finish(token)

    async def post(self) -> None:
        self.answer_refusal()
        if self.upload is not None:
            await self.finish_upload()
            paths = [self.target]
        else:
            paths = await self._save_batch()
        self.audit_detail["files"] = paths
        self.send([written(p) for p in paths])

    async def _save_batch(self) -> list[str]:
        files: dict[str, list[httputil.HTTPFile]] = {}
        try:
            httputil.parse_body_arguments(
                self.request.headers.get("Content-Type", ""), bytes(self.batch or b""), {}, files
            )
        except httputil.HTTPInputError as e:
            raise BadRequest(f"the upload is not valid multipart/form-data: {e}") from None
        parts = [part for batch in files.values() for part in batch]
        if not parts:
            raise BadRequest("send each file as a multipart/form-data part with a filename")
        named = self.get_query_argument("path", None)
        if self.grant is not None and len(parts) != 1:  # its path is the one it was signed for
            raise Forbidden("a signed upload URL writes one file, the one it was signed for")
        self.check_upload(sum(len(p.body) for p in parts))
        workspace = self.workspace()
        if sum(len(p.body) for p in parts) > await workspace.free_bytes():
            raise FileTooLarge("the files do not fit in the workspace's remaining space")
        paths = []
        for part in parts:
            path = workspace_path(named if named and len(parts) == 1 else part.filename)
            await workspace.save(path, part.body)
            paths.append(path)
        return paths


class RevokeUrlHandler(JSONHandler):
    """``POST {"url": ...}`` with an API token: a signed file URL of the sandbox stops working.

    The SDK signs its URLs itself, so a revocation names the URL; it is kept
    until the URL expires anyway (``access/file_urls.py``).
    """

    actions = {"POST": "files.revoke_url"}

    async def post(self, session_id: str) -> None:
        url = self.json_body().get("url")
        self.manager.get(session_id, self.principal)  # another tenant's: 404
        credentials: Credentials = self.settings["sbx_e2b_credentials"]
        await credentials.revoke(session_id, url)
        self.set_status(204)
        self.finish()


routes = [
    (r"/health", HealthHandler),
    (FILES, FilesHandler),
    (r"/v1/sessions/(?P<session_id>[^/]+)/file-urls/revoke", RevokeUrlHandler),
]
