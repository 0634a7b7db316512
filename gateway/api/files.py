"""Files in and out of a session's workspace, streamed both ways."""

from __future__ import annotations

import abc
import errno
import urllib.parse
from collections.abc import Callable
from typing import Any

import tornado.web

from ..errors import BadRequest, Conflict, Denied, FileTooLarge, GatewayError
from ..workspace.files import AsyncReader, AsyncUpload, AsyncWorkspace
from .base import JSONHandler

_SESSION = r"/v1/sessions/(?P<session_id>[^/]+)/files"


# A multipart batch is parsed in memory; single large files use the streamed PUT.
MAX_BATCH = 64 * 2**20


class FilesHandler(JSONHandler):
    """``GET ?path=dir`` lists a directory; ``POST ?path=dir`` takes a multipart batch."""

    actions = {"POST": "files.upload"}

    def body_limit(self) -> int:
        return MAX_BATCH

    async def get(self, session_id: str) -> None:
        workspace = self.workspaces.files(session_id, self.principal)
        path = self.get_argument("path", "")
        fmt = self.get_argument("format", None)
        if fmt is not None:
            await _send_archive(self, workspace, session_id, path, fmt)
            return
        self.send({"path": path, **await workspace.list(path)})

    async def post(self, session_id: str) -> None:
        workspace = self.workspaces.files(session_id, self.principal)
        directory = self.get_argument("path", "").strip("/")
        files = [f for batch in self.request.files.values() for f in batch]
        if not files:
            raise BadRequest("send the files as multipart/form-data parts with a filename")
        size = sum(len(f.body) for f in files)
        self.workspaces.check_file(session_id, self.principal, "upload", size)
        if size > await workspace.free_bytes():
            raise FileTooLarge("the files do not fit in the workspace's remaining space")
        saved = []
        for part in files:
            path = f"{directory}/{part.filename}" if directory else part.filename
            upload = await workspace.save(path, part.body)
            saved.append({"path": path, "size": upload.size, "sha256": upload.sha256})
        self.audit_detail["files"] = saved
        self.send({"files": saved}, status=201)


async def _send_archive(
    handler: JSONHandler, workspace: AsyncWorkspace, session_id: str, path: str, fmt: str
) -> None:
    """Stream a directory's archive as it is made; one past the size limit is a 413.

    The limit is the smaller of ``max_archive_size`` and the policy's ``max_download``.
    """
    limit = handler.api_options.max_archive_size
    policy_limit = handler.workspaces.check_file(session_id, handler.principal, "download")
    source = await workspace.archive(path, fmt, min(limit, policy_limit or limit))
    name = path.rstrip("/").rsplit("/", 1)[-1] or "workspace"
    name += ".tar.gz" if fmt == "tar" else ".zip"
    handler.set_header("Content-Type", "application/gzip" if fmt == "tar" else "application/zip")
    attachment(handler, name)
    await stream_file(handler, source)


def attachment(handler: JSONHandler, name: str) -> None:
    """Name the download; any name, as RFC 6266 says, with an ASCII fallback for old clients."""
    ascii_name = "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in name)
    quoted = urllib.parse.quote(name, safe="", errors="replace")
    handler.set_header(
        "Content-Disposition", f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quoted}"
    )


async def stream_file(handler: JSONHandler, source: AsyncReader) -> None:
    """Copy a file to the response a chunk at a time, waiting for the client.

    What was sent is recorded (audited) with its size and SHA-256.
    """
    async with source:
        await handler.flush()  # the headers at once: an archive's first piece may take a moment
        try:
            while chunk := await source.read():
                handler.write(chunk)
                await handler.flush()
        except Exception:
            # The status is sent: ending the response as usual (as an error after the
            # headers does) would tell the client it has the whole file. It is cut instead.
            handler.request.connection.close()
            raise
    handler.audit_detail.update(size=source.size, sha256=source.sha256)
    handler.finish()


async def send_file(
    handler: JSONHandler, files: AsyncWorkspace, path: str, check: Callable[[int], object]
) -> None:
    """Stream one file as a download, once ``check(size)`` (the file rules) lets it go."""
    source, info = await files.open_read(path)
    try:
        check(info.st_size)
    except Denied:
        await source.aclose()
        raise
    handler.set_header("Content-Length", str(info.st_size))
    handler.set_header("Content-Type", "application/octet-stream")
    attachment(handler, path.rsplit("/", 1)[-1])
    await stream_file(handler, source)


class StreamedUpload(abc.ABC):
    """An upload written to disk as its body streams in (a ``stream_request_body`` handler).

    The body streams in after ``prepare``, so whatever ``prepare`` refuses is
    answered only once the body is in: an answer given earlier makes Tornado
    drop the connection, and the client sees a reset instead of the error.
    A handler starts its upload in ``start_upload`` and ends it with
    ``finish_upload``; a closed connection discards it.
    """

    upload_method = "PUT"
    disk = "the workspace"  # what an upload that found no room filled
    upload: AsyncUpload | None = None
    failure: BaseException | None = None
    refusal: GatewayError | None = None
    request: Any

    async def prepare(self) -> None:
        try:
            super().prepare()  # type: ignore[misc]  # the body is not in yet
            if self.request.method == self.upload_method:
                await self.start_upload()
        except GatewayError as e:
            self.refusal = e

    @abc.abstractmethod
    async def start_upload(self) -> None:
        """Check the request and open ``self.upload`` (or leave it None: nothing to write)."""

    @abc.abstractmethod
    def check_upload(self, size: int) -> None:
        """Refuse an upload of ``size`` bytes that the session's file rules forbid (Denied)."""

    def answer_refusal(self) -> None:
        if self.refusal is not None:
            raise self.refusal

    async def data_received(self, chunk: bytes) -> None:
        if self.upload is None or self.failure is not None:
            return
        try:
            await self.upload.write(chunk)
        except OSError as e:  # ENOSPC: remember it, answer once the body is in
            self.failure = e

    async def finish_upload(self) -> AsyncUpload:
        """Put the file in place (or discard it, if writing failed); its size and SHA-256.

        The file rules see the bytes that arrived, not only the size declared
        at the start: a chunked body declares none.
        """
        upload, self.upload = self.upload, None
        assert upload is not None
        try:
            if self.failure is None:
                self.check_upload(upload.size)
        except GatewayError:
            await upload.finish(False)
            raise
        await upload.finish(self.failure is None)
        if self.failure is not None:
            raise FileTooLarge(f"upload failed: {self.failure}; {self.disk} is full")
        return upload

    def on_finish(self) -> None:
        self._discard()
        super().on_finish()  # type: ignore[misc]

    def on_connection_close(self) -> None:
        self._discard()

    def _discard(self) -> None:
        if self.upload is not None:
            upload, self.upload = self.upload, None
            upload.discard()


async def open_upload(request: Any, workspace: AsyncWorkspace, path: str) -> AsyncUpload:
    """Start an upload to ``path`` if its declared size fits the workspace; allow that much."""
    free = await workspace.free_bytes()
    declared = int(request.headers.get("Content-Length", 0) or 0)
    if declared > free:
        raise FileTooLarge(
            f"{declared} bytes do not fit: the workspace has {free} bytes free "
            "(its size is the session's disk limit)"
        )
    request.connection.set_max_body_size(max(free, 1))
    try:
        return await workspace.open_write(path)
    except OSError as e:  # bytes free, but no inode for the file or a parent directory
        if e.errno != errno.ENOSPC:
            raise
        raise FileTooLarge(
            f"no room for another file: {e.strerror} (the filesystem's files are all used, "
            "however many bytes are free); delete some files, then upload again"
        ) from None


@tornado.web.stream_request_body
class FileHandler(StreamedUpload, JSONHandler):
    """One path: ``PUT`` uploads (streamed), ``GET`` downloads (streamed), ``DELETE``."""

    actions = {"PUT": "files.upload", "GET": "files.download", "DELETE": "files.delete"}
    forwards = False

    async def start_upload(self) -> None:
        workspace = self.workspaces.files(self.path_kwargs["session_id"], self.principal)
        self.check_upload(int(self.request.headers.get("Content-Length", 0) or 0))
        self.upload = await open_upload(self.request, workspace, self.path_kwargs["path"])

    def check_upload(self, size: int) -> None:
        self.workspaces.check_file(self.path_kwargs["session_id"], self.principal, "upload", size)

    async def put(self, session_id: str, path: str) -> None:
        self.answer_refusal()
        upload = await self.finish_upload()
        saved = {"path": path, "size": upload.size, "sha256": upload.sha256}
        self.audit_detail.update(saved)
        self.send(saved, status=201)

    async def get(self, session_id: str, path: str) -> None:
        self.answer_refusal()
        workspace = self.workspaces.files(session_id, self.principal)
        fmt = self.get_argument("format", None)
        self.audit_detail["path"] = path
        if fmt is not None:
            await _send_archive(self, workspace, session_id, path, fmt)
            return
        await send_file(
            self,
            workspace,
            path,
            lambda size: self.workspaces.check_file(session_id, self.principal, "download", size),
        )

    async def delete(self, session_id: str, path: str) -> None:
        self.answer_refusal()
        self.audit_detail["path"] = path
        workspace = self.workspaces.files(session_id, self.principal)
        self.workspaces.check_file(session_id, self.principal, "delete")
        await workspace.remove(path)
        self.set_status(204)
        self.finish()


def _only(body: dict[str, Any], *names: str) -> dict[str, Any]:
    """The body, refused if it has a field besides ``names`` (a misspelt one does nothing)."""
    unknown = sorted(set(body) - set(names))
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown}; this request takes {list(names)}")
    return body


def _path_field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value.strip("/"):
        raise BadRequest(f'{name!r} must be a workspace path, e.g. "out/data.csv"')
    return value


class RenameHandler(JSONHandler):
    """``POST {"from": path, "to": path}``: rename (move) a file or directory.

    The destination's parents are made; an existing destination file is
    replaced, as ``mv`` does. The old name goes, so a policy that refuses
    deleting refuses this too.
    """

    actions = {"POST": "files.rename"}

    async def post(self, session_id: str) -> None:
        body = _only(self.json_body(), "from", "to")
        source, destination = _path_field(body, "from"), _path_field(body, "to")
        self.audit_detail.update({"from": source, "to": destination})
        workspace = self.workspaces.files(session_id, self.principal)
        self.workspaces.check_file(session_id, self.principal, "delete")
        self.send(await workspace.move(source, destination))


class DirectoriesHandler(JSONHandler):
    """``POST {"path": dir}``: make a directory and its parents (201; 200 if it was there)."""

    actions = {"POST": "files.make_dir"}

    async def post(self, session_id: str) -> None:
        path = _path_field(_only(self.json_body(), "path"), "path")
        self.audit_detail["path"] = path
        workspace = self.workspaces.files(session_id, self.principal)
        created = await workspace.make_dir(path)
        entry = await workspace.stat(path)
        if entry["type"] != "directory":
            raise Conflict(f"{path!r} is a {entry['type']}, not a directory")
        self.send(entry, status=201 if created else 200)


_ACTIONS = r"/v1/sessions/(?P<session_id>[^/]+)"

routes = [
    (_SESSION, FilesHandler),
    (_SESSION + r"/(?P<path>.+)", FileHandler),
    (_ACTIONS + r"/rename", RenameHandler),
    (_ACTIONS + r"/directories", DirectoriesHandler),
]
