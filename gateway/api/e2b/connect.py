"""envd's Connect RPC services, served by the generated ASGI apps the ``e2b`` package ships.

The SDK's own ``filesystem_connect`` / ``process_connect`` modules hold both
the clients it uses and the server applications; the ``connectrpc`` library
behind them reads envelopes, negotiates codecs and compression, and writes
errors. This module only runs one such app per request inside Tornado (a
small ASGI bridge) and implements the services over the session's
workspace and commands, so no envelope or protobuf is parsed by hand here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from connectrpc.code import Code
from connectrpc.codec import Codec, proto_binary_codec, proto_json_codec
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_connect as fs_rpc
from e2b.envd.filesystem import filesystem_pb as fs
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

from ...errors import (
    BadRequest,
    Conflict,
    FileNotFound,
    GatewayError,
    NotFound,
    NotSupported,
    PathForbidden,
    PayloadTooLarge,
    SessionNotFound,
    Unauthorized,
    UnsupportedMediaType,
)
from ...sandbox.files import AsyncWorkspace
from ...sandbox.workspace import parse_iso
from .base import SandboxHandler
from .envd import sdk_path, workspace_path

log = logging.getLogger(__name__)

MAX_MESSAGE = 1 * 2**20  # an RPC request is a path or a few bytes of stdin
CONTENT_TYPES = ("application/proto", "application/json", "application/connect+")

# How the gateway's errors read as Connect codes (the SDK maps these to its exceptions).
CODES: list[tuple[type[GatewayError], Code]] = [
    (SessionNotFound, Code.UNAVAILABLE),
    (FileNotFound, Code.NOT_FOUND),
    (NotFound, Code.NOT_FOUND),
    (PathForbidden, Code.PERMISSION_DENIED),
    (Unauthorized, Code.UNAUTHENTICATED),
    (PayloadTooLarge, Code.RESOURCE_EXHAUSTED),
    (NotSupported, Code.UNIMPLEMENTED),
    (Conflict, Code.FAILED_PRECONDITION),
    (BadRequest, Code.INVALID_ARGUMENT),
]


def connect_error(error: GatewayError) -> ConnectError:
    code = next((c for kind, c in CODES if isinstance(error, kind)), Code.INTERNAL)
    message = error.message
    if isinstance(error, SessionNotFound):
        message = "The sandbox was not found"  # the SDK's words for a sandbox gone
    return ConnectError(code, message)


@contextlib.contextmanager
def as_connect_errors() -> Iterator[None]:
    """Raise the gateway's errors as Connect errors, which the library answers with."""
    try:
        yield
    except GatewayError as e:
        raise connect_error(e) from e


HOME_NAME = "user"  # the workspace's own name, as envd names /home/user
_KINDS = {"file": fs.FileType.FILE, "directory": fs.FileType.DIRECTORY,
          "symlink": fs.FileType.SYMLINK}  # fmt: skip


def entry_info(entry: dict[str, Any]) -> fs.EntryInfo:
    """A workspace entry as envd's ``EntryInfo``."""
    kind = entry["type"]
    mode = 0o755 if kind == "directory" else 0o644
    modified = Timestamp(seconds=int(parse_iso(entry["modified"]))) if entry["modified"] else None
    return fs.EntryInfo(
        name=entry["name"] or HOME_NAME,
        type=_KINDS.get(kind, fs.FileType.UNSPECIFIED),
        path=sdk_path(entry["path"]),
        size=entry["size"] or 0,
        mode=mode,
        permissions="drwxr-xr-x" if kind == "directory" else "-rw-r--r--",
        owner="user",
        group="user",
        modified_time=modified,
        is_symlink=kind == "symlink",
    )


class FilesystemService(fs_rpc.Filesystem):
    """envd's Filesystem service over the session's workspace; watching is not offered."""

    def __init__(self, workspace: AsyncWorkspace) -> None:
        self.workspace = workspace

    async def stat(self, request: fs.StatRequest, ctx: Any, /) -> fs.StatResponse:
        with as_connect_errors():
            entry = await self.workspace.stat(workspace_path(request.path))
        return fs.StatResponse(entry=entry_info(entry))

    async def make_dir(self, request: fs.MakeDirRequest, ctx: Any, /) -> fs.MakeDirResponse:
        with as_connect_errors():
            path = workspace_path(request.path)
            if not await self.workspace.make_dir(path):
                raise ConnectError(Code.ALREADY_EXISTS, f"{request.path} already exists")
            entry = await self.workspace.stat(path)
        return fs.MakeDirResponse(entry=entry_info(entry))

    async def move(self, request: fs.MoveRequest, ctx: Any, /) -> fs.MoveResponse:
        with as_connect_errors():
            source = workspace_path(request.source)
            entry = await self.workspace.move(source, workspace_path(request.destination))
        return fs.MoveResponse(entry=entry_info(entry))

    async def list_dir(self, request: fs.ListDirRequest, ctx: Any, /) -> fs.ListDirResponse:
        with as_connect_errors():
            path = workspace_path(request.path)
            if (await self.workspace.stat(path))["type"] != "directory":
                raise BadRequest(f"{request.path} is not a directory")
            tree = await self.workspace.tree(path, max(1, request.depth))
        return fs.ListDirResponse(entries=[entry_info(e) for e in tree["entries"]])

    async def remove(self, request: fs.RemoveRequest, ctx: Any, /) -> fs.RemoveResponse:
        with as_connect_errors():
            await self.workspace.remove(workspace_path(request.path))
        return fs.RemoveResponse()


class StrictCodec:
    """A library codec whose undecodable message is the caller's error (INVALID_ARGUMENT).

    The library leaves a decoder's own exception to surface as an internal error.
    """

    def __init__(self, codec: Codec) -> None:
        self.codec = codec

    def name(self) -> str:
        return self.codec.name()

    def encode(self, message: Any) -> bytes:
        return self.codec.encode(message)

    def decode(self, data: bytes | bytearray, message_class: type) -> Any:
        try:
            return self.codec.decode(data, message_class)
        except ConnectError:
            raise
        except Exception as e:
            raise ConnectError(
                Code.INVALID_ARGUMENT, f"the request is not a valid {self.name()} message: {e}"
            ) from None


CODECS = [StrictCodec(proto_binary_codec()), StrictCodec(proto_json_codec())]

# Each service: its generated protocol (for its method names) and its app for one request.
SERVICES: dict[str, tuple[type, Callable[[ConnectHandler], Any]]] = {
    "filesystem.Filesystem": (
        fs_rpc.Filesystem,
        lambda handler: fs_rpc.FilesystemASGIApplication(
            FilesystemService(handler.manager.files(handler.sandbox_id, handler.principal)),
            read_max_bytes=MAX_MESSAGE,
            codecs=CODECS,
        ),
    ),
}


class ConnectHandler(SandboxHandler):
    """One Connect RPC call (``POST /<package.Service>/<Method>``), served by the library."""

    actions = {"POST": "sandbox.rpc"}
    closed: asyncio.Event

    def body_limit(self) -> int:
        return MAX_MESSAGE

    async def post(self, service: str, method: str) -> None:
        kind = self.request.headers.get("Content-Type", "")
        if not kind.startswith(CONTENT_TYPES):
            raise UnsupportedMediaType(
                f"Connect RPC bodies are application/proto or application/json, not {kind!r}"
            )
        protocol, make = SERVICES.get(service, (None, None))
        if protocol is None or make is None:
            raise NotFound(f"no such service: {service}; envd offers {', '.join(SERVICES)}")
        if method not in {m.name for m in protocol.desc().methods}:
            raise NotFound(f"{service} has no method {method}")
        self.audit_detail["rpc"] = f"{service}/{method}"
        self.closed = asyncio.Event()
        await serve_asgi(self, make(self))

    def on_connection_close(self) -> None:
        if hasattr(self, "closed"):
            self.closed.set()


async def serve_asgi(handler: ConnectHandler, app: Any) -> None:
    """Run an ASGI app for the handler's request: its body in, its answer streamed out."""
    request = handler.request
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": request.protocol,
        "path": request.path,
        "raw_path": request.path.encode(),
        "root_path": "",
        "query_string": request.query.encode(),
        "headers": [(k.lower().encode(), v.encode()) for k, v in request.headers.get_all()],
        "client": (request.remote_ip, 0),
        "extensions": {},
    }
    body_sent = False

    async def receive() -> dict[str, Any]:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await handler.closed.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            handler.set_status(message["status"])
            handler.clear_header("Content-Type")
            for name, value in message.get("headers", ()):
                handler.add_header(name.decode("latin-1"), value.decode("latin-1"))
        elif message["type"] == "http.response.body":
            if message.get("body"):
                handler.write(message["body"])
            if message.get("more_body"):
                await handler.flush()

    try:
        await app(scope, receive, send)
    except Exception:
        if not handler._headers_written:
            raise
        log.exception("a Connect call failed after its answer began")
    if not handler._finished:
        handler.finish()
